"""Authentication for the agent API: a cluster's bearer token.

Readers (agent token, personal token or session) are composed in apps.access.auth, which
knows users and their roles; the core stays below it."""

from django.http import HttpRequest
from ninja.security import HttpBearer

from apps.clusters.models import AgentToken
from apps.clusters.selectors import token_authenticate


class AgentBearer(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> AgentToken | None:
        agent_token = token_authenticate(secret=token)
        if agent_token is not None:
            request.agent_token = agent_token
        return agent_token


agent_auth = AgentBearer()
