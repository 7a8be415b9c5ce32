from django.db import models


class NodeState(models.TextChoices):
    ACTIVE = "active"
    CORDONED = "cordoned"
    DRAINING = "draining"
    DOWN = "down"
    # cordoned for repair ("send to maintenance"): out of run plans until an operator returns
    # it to service with a note (apps.commands.services.nodes)
    MAINTENANCE = "maintenance"


# Out of run plans by an operator's (or a policy's) word: cordoned, draining, in maintenance.
OUT_OF_PLANS = frozenset({NodeState.CORDONED, NodeState.DRAINING, NodeState.MAINTENANCE})


class NodeDownBy(models.TextChoices):
    """Why a `down` node is down, and so what brings it back (docs/actions.md)."""

    HEARTBEAT = "heartbeat"  # it went silent: back when it reports again (nodes_touch)
    SCHEDULER = "scheduler"  # the scheduler's state hook: back when the scheduler says so
