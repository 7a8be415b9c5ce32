from django.db import models


class RunState(models.TextChoices):
    RUNNING = "running"
    STOPPED = "stopped"
    FINISHED = "finished"
    FAILED = "failed"


class EventKind(models.TextChoices):
    CHECKPOINT = "checkpoint"
    RESTART = "restart"
    OOM = "oom"
    XID = "xid"
    ECC = "ecc"
    ERROR = "error"
    LOG = "log"
