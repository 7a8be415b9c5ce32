from django.db import models


class ActorKind(models.TextChoices):
    USER = "user"
    TOKEN = "token"  # a user acting through a personal API token
    POLICY = "policy"
    AGENT = "agent"  # a node agent, by its cluster's agent token (named: id and name)
    SYSTEM = "system"  # the server's own passes (the expiry sweep)
    SCHEDULER = "scheduler"  # the cluster's scheduler, read by its state hook


class Outcome(models.TextChoices):
    ALLOWED = "allowed"
    DENIED = "denied"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INVALID = "invalid"  # refused as malformed (a 4xx other than 403/404), not for who asked


class AuditAction:
    """The action names written by the apps (free text in the table: apps add their own)."""

    ADMIN_ADD = "admin.add"  # through the Django admin, any model (apps/audit/admin_site.py)
    ADMIN_CHANGE = "admin.change"
    ADMIN_DELETE = "admin.delete"
    AGENT_TOKEN_ISSUE = "agent_token.issue"
    AGENT_TOKEN_REVOKE = "agent_token.revoke"
    ALERT_ACKNOWLEDGE = "alert.acknowledge"
    ALERT_SILENCE = "alert.silence"
    AUDIT_PRUNE = "audit.prune"  # entries past AUDIT_RETENTION_DAYS deleted (`audit_prune`)
    COMMAND_ACK = "command.ack"
    COMMAND_EXPIRE = "command.expire"
    # command.<kind> (checkpoint, stop, …) is an attempt to issue one: allowed, denied (also
    # answered 404: its target is in a cluster the user cannot see) or invalid (a 4xx)
    COMMAND_ISSUE_PREFIX = "command."
    ROLE_GRANT = "role.grant"
    ROLE_REVOKE = "role.revoke"
    TOKEN_ISSUE = "token.issue"
    TOKEN_REVOKE = "token.revoke"
