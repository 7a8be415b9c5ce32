from django.db import models


class RunState(models.TextChoices):
    RUNNING = "running"
    STOPPED = "stopped"
    FINISHED = "finished"
    FAILED = "failed"


# A run_end event (finished or failed) ends a run: it is no longer evaluated, and its nodes
# without a node agent are idle rather than missing.
ENDED_STATES = (RunState.FINISHED, RunState.FAILED)


class EventKind(models.TextChoices):
    CHECKPOINT = "checkpoint"
    RESTART = "restart"
    OOM = "oom"
    XID = "xid"
    ECC = "ecc"
    ERROR = "error"
    LOG = "log"
    RUN_END = "run_end"
