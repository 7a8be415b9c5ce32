from django.db import models


class NodeState(models.TextChoices):
    ACTIVE = "active"
    CORDONED = "cordoned"
    DRAINING = "draining"
    DOWN = "down"
