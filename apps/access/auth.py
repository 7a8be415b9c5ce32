"""Personal API tokens (`Authorization: Bearer obu_…`): the request acts as the token's user.

Agents use Bearer too; a user token is recognised by its prefix, so an API accepting both
lists `user_token_auth` beside the agent bearer and each skips the other's tokens."""

from django.http import HttpRequest
from ninja import security
from ninja.security import HttpBearer

from apps.access.models import UserToken
from apps.access.selectors import user_token_authenticate
from apps.core.auth import agent_auth


class UserTokenBearer(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> UserToken | None:
        user_token = user_token_authenticate(secret=token)
        if user_token is not None:
            request.user = user_token.user
            request.user_token = user_token
        return user_token


user_token_auth = UserTokenBearer()


class SessionAuth(security.SessionAuth):
    """Django's session, its CSRF rules checked as ninja's are, but only for a request whose
    session is logged in: one without a session cookie (an agent's or a stranger's), or
    with a cookie that names no logged-in session, does not hold this credential, and gets
    the 401 of a missing credential, not a 403 for a missing CSRF token (found by
    tests/api/test_schemathesis.py). The class keeps ninja's name: it names the security
    scheme in the OpenAPI schema."""

    def _get_key(self, request: HttpRequest) -> str | None:
        user = getattr(request, "user", None)
        if self.param_name not in request.COOKIES or not (user and user.is_authenticated):
            return None
        return super()._get_key(request)


session_auth = SessionAuth()
# Reading back is open to a cluster's token, to a user's personal token (the "obu_" prefix
# tells them apart) or to a logged-in user (session + CSRF); a user sees only the clusters
# they hold a role in (request_cluster_filter).
reader_auth = [agent_auth, user_token_auth, session_auth]
