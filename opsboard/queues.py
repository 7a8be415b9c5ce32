"""Celery's settings, apart from the broker's address (opsboard.settings: Redis may be the
embedded one): queues, routes, acks and the broker's timeouts. opsboard.settings imports them
all; every value comes from the environment (opsboard.env)."""

from opsboard.env import env, envfloat, envint

# Keys, channel names and the Celery queue share this prefix, so that several stacks (a demo
# and a test session, say) can share one Redis without taking each other's work.
REDIS_PREFIX = env("OPSBOARD_REDIS_PREFIX", "opsboard")
CELERY_TASK_DEFAULT_QUEUE = REDIS_PREFIX
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A lost broker is tried again at once, then every this many seconds (Celery's own waits grow
# to 30 s): opsboard/celery_consumer.py.
CELERY_WORKER_CONSUMER = "opsboard.celery_consumer:PromptReconnectConsumer"
BROKER_RECONNECT_MAX_S = envfloat("BROKER_RECONNECT_MAX_S", 1.0)
# Celery's Django fixup closes the connection pool of a prefork child after every task, so
# each task forked a new Postgres backend (≈ 1 per drain: a fifth of the CPU under ingest,
# docs/performance-history.md). With a reuse count it keeps the pool; opsboard.celery returns the
# connection to that pool after each task instead, dropping one that broke.
CELERY_DB_REUSE_MAX = envint("CELERY_DB_REUSE_MAX", 1000)
# Beat's periodic work has a queue of its own, consumed by a worker of its own (`make run`,
# compose, the test stack): behind ~60 ingest tasks a second, evaluation passes waited in the
# default queue until they expired, and detection stopped exactly when the system was busiest.
CELERY_PERIODIC_QUEUE = f"{REDIS_PREFIX}.periodic"
CELERY_TASK_ROUTES = {
    name: {"queue": CELERY_PERIODIC_QUEUE}
    for name in (
        "alerts.evaluate_all",  # the tick: a pass per cluster, and the webhook sweep
        "alerts.evaluate_cluster",  # any periodic worker takes any cluster's pass
        "history.rollups_refresh",
        "history.prune",
        "history.partitions_maintain",
        "telemetry.chunks_compact",
        "runs.steps_compact",
        "runs.completions_refresh",
        "ingest.inbox_sweep",
        "ingest.inbox_prune",
        "runs.events_prune",
        "alerts.prune",
        "alerts.alertmanager_resend",
        "alerts.age",
        "commands.prune",
        "access.logins_prune",
        "commands.sweep",
        # scheduler hooks: off the request path, never behind a backlog of ingest
        "commands.node_carry_out",
        "commands.scheduler_states_poll_all",
        "commands.scheduler_states_poll",
    )
}
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "socket_connect_timeout": 1,
    "socket_timeout": 5,
    "visibility_timeout": envint("CELERY_VISIBILITY_TIMEOUT", 600),
    # A publisher re-establishing a dead broker connection tries once more, briefly: the
    # ingest view must answer 202 at once (the inbox sweep enqueues the row later), not
    # wait on kombu's reconnect loop (seen at 20 s and more per request).
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
INGEST_SWEEP_INTERVAL = envfloat("INGEST_SWEEP_INTERVAL", 15.0)
CELERY_BEAT_SCHEDULE = {
    "inbox-sweep": {"task": "ingest.inbox_sweep", "schedule": INGEST_SWEEP_INTERVAL},
    "chunks-compact": {"task": "telemetry.chunks_compact", "schedule": 60.0},
}
# How many of beat's tasks run at once (a cluster's passes never overlap: its own Redis lock).
PERIODIC_WORKER_CONCURRENCY = envint("PERIODIC_WORKER_CONCURRENCY", 2)
