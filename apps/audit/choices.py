from django.db import models


class ActorKind(models.TextChoices):
    USER = "user"
    TOKEN = "token"  # a user acting through a personal API token
    POLICY = "policy"
    AGENT = "agent"


class Outcome(models.TextChoices):
    ALLOWED = "allowed"
    DENIED = "denied"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class AuditAction:
    """The action names written by the apps (free text in the table: apps add their own)."""

    ALERT_ACKNOWLEDGE = "alert.acknowledge"
    ROLE_GRANT = "role.grant"
    ROLE_REVOKE = "role.revoke"
    TOKEN_ISSUE = "token.issue"
    TOKEN_REVOKE = "token.revoke"
