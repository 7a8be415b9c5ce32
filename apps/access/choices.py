from django.db import models


class Role(models.TextChoices):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"


class Action(models.TextChoices):
    VIEW = "view"
    OPERATE = "operate"
    ADMINISTER = "administer"


# The roles that may do an action on a cluster (a superuser may do every action everywhere).
ROLES_FOR_ACTION: dict[str, frozenset[str]] = {
    Action.VIEW: frozenset({Role.VIEWER, Role.OPERATOR, Role.ADMIN}),
    Action.OPERATE: frozenset({Role.OPERATOR, Role.ADMIN}),
    Action.ADMINISTER: frozenset({Role.ADMIN}),
}

# Personal API tokens start with this, so that a bearer token is tried as a user's token or
# as an agent's without a second lookup (agent tokens are plain token_urlsafe values).
USER_TOKEN_PREFIX = "obu_"
