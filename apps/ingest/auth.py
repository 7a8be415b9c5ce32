"""Authentication for the agent API: a cluster's bearer token, or a logged-in user."""

from django.http import HttpRequest
from ninja.security import HttpBearer, SessionAuth

from apps.clusters.models import AgentToken
from apps.clusters.selectors import token_authenticate


class AgentBearer(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> AgentToken | None:
        agent_token = token_authenticate(secret=token)
        if agent_token is not None:
            request.agent_token = agent_token
        return agent_token


agent_auth = AgentBearer()
# Reading back is open to a cluster's token or to a logged-in operator (session + CSRF).
reader_auth = [agent_auth, SessionAuth()]
