from django.db import models


class NodeState(models.TextChoices):
    ACTIVE = "active"
    CORDONED = "cordoned"
    DRAINING = "draining"
    DOWN = "down"


class NodeDownBy(models.TextChoices):
    """Why a `down` node is down, and so what brings it back (docs/actions.md)."""

    HEARTBEAT = "heartbeat"  # it went silent: back when it reports again (nodes_touch)
    SCHEDULER = "scheduler"  # the scheduler's state hook: back when the scheduler says so
