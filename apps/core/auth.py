"""Authentication for the agent API: a cluster's bearer token.

Readers (agent token, personal token or session) are composed in apps.access.auth, which
knows users and their roles; the core stays below it."""

from django.http import HttpRequest
from ninja.security import HttpBearer

from apps.clusters.models import AgentToken
from apps.clusters.selectors import token_authenticate

# A node-bound token (AgentToken.nodes) posting, polling or acknowledging as another node
NODE_NOT_OURS = "this token acts only for its own nodes, and this is not one of them"
COMMAND_NOT_OURS = "this token acts only for its own nodes: the command was not handed to them"


class AgentBearer(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> AgentToken | None:
        agent_token = token_authenticate(secret=token)
        if agent_token is not None:
            request.agent_token = agent_token
        return agent_token


agent_auth = AgentBearer()
