"""Opsboard's own settings, by domain: alerts, commands, history, ingest, the live feed. Every
value comes from the environment (opsboard.env); opsboard.settings imports them all, and adds
`beat_schedule` (their periodic tasks) to Celery beat's schedule.
"""

from opsboard.env import env, envfloat, envint, envlist

beat_schedule: dict[str, dict] = {}


def periodic(task: str, every: float) -> dict:
    """Beat's entry for `task` every `every` seconds. A late run is worthless once the next one
    is due, so it expires then rather than pile up behind a busy worker: an expired run is
    logged and counted (opsboard.celery), and the next run covers the gap (an evaluation
    reads the whole window as of its own time, a rollup or prune pass all that is due)."""
    return {"task": task, "schedule": every, "options": {"expires": every}}


# --- Alerts ------------------------------------------------------------------------------
# Detectors run over every active cluster this often (a Celery beat task, never on a request).
ALERT_EVALUATE_INTERVAL = envfloat("ALERT_EVALUATE_INTERVAL", 5.0)
beat_schedule["alerts-evaluate"] = periodic("alerts.evaluate_all", ALERT_EVALUATE_INTERVAL)
# An open alert resolves once its condition has been clear this long (heartbeat: at once).
ALERT_HOLD_DOWN_S = envfloat("ALERT_HOLD_DOWN_S", 60.0)
# The detectors' window: the last N steps of every rank, recent telemetry and events.
ALERT_STEP_WINDOW = envint("ALERT_STEP_WINDOW", 120)
ALERT_TELEMETRY_WINDOW_S = envfloat("ALERT_TELEMETRY_WINDOW_S", 600.0)
# ... read at most one point per series per this many seconds (the newest): a pass's memory
# is then bounded by the cluster's series, not by how densely agents sample (docs/faults.md, 10)
ALERT_TELEMETRY_RESOLUTION_S = envfloat("ALERT_TELEMETRY_RESOLUTION_S", 1.0)
ALERT_EVENT_WINDOW_S = envfloat("ALERT_EVENT_WINDOW_S", 900.0)
# A periodic worker keeps the windows of the clusters it evaluates between passes (step rows,
# ~100 B each as Python objects, and telemetry points, ~27 B each in numpy with room to grow);
# past this many in all it drops the least recently evaluated others
# (apps.alerts.selectors.kept), which then read whole next time.
ALERT_KEPT_MAX_ROWS = envint("ALERT_KEPT_MAX_ROWS", 10_000_000)
# Clusters (and runs) with no data for this long are not evaluated (their open alerts are).
ALERT_IDLE_S = envfloat("ALERT_IDLE_S", 3600.0)
# Outgoing webhooks: attempts in all, first retry after up to BACKOFF seconds, then doubling.
ALERT_WEBHOOK_ATTEMPTS = envint("ALERT_WEBHOOK_ATTEMPTS", 5)
ALERT_WEBHOOK_BACKOFF_S = envint("ALERT_WEBHOOK_BACKOFF_S", 2)
ALERT_WEBHOOK_TIMEOUT_S = envfloat("ALERT_WEBHOOK_TIMEOUT_S", 5.0)
# Firing alerts are posted again to Alertmanager endpoints this often: well within its
# resolve_timeout (5 min by default), after which it would resolve them itself.
ALERTMANAGER_RESEND_S = envfloat("ALERTMANAGER_RESEND_S", 60.0)
beat_schedule["alertmanager-resend"] = periodic("alerts.alertmanager_resend", ALERTMANAGER_RESEND_S)
# Amber that ages (apps.alerts.services.ageing): a warning left unacknowledged past its
# cluster's `warning_age_min` (default ALERT_WARNING_AGE_MIN; 0: never) escalates once.
ALERT_WARNING_AGE_MIN = envint("ALERT_WARNING_AGE_MIN", 30)
ALERT_AGEING_INTERVAL = envfloat("ALERT_AGEING_INTERVAL", 60.0)
beat_schedule["alerts-age"] = periodic("alerts.age", ALERT_AGEING_INTERVAL)
# Opsboard's address as people reach it: the links in notifications (Alertmanager's
# runbook_url / opsboard_url annotations) point there.
OPSBOARD_URL = env("OPSBOARD_URL", "http://127.0.0.1:8000")

# --- Commands (docs/actions.md) ---------------------------------------------------------------
# A command nobody carried out this long after it was issued ends `expired`.
COMMANDS_EXPIRE_AFTER_S = envfloat("COMMANDS_EXPIRE_AFTER_S", 600.0)
# An operator's Idempotency-Key names its command this long after it was issued; later the
# key may name a new command. The system's keys (drain steps, the policy) never expire.
COMMANDS_IDEMPOTENCY_TTL_S = envfloat("COMMANDS_IDEMPOTENCY_TTL_S", 86400.0)
# A delivered command not acknowledged this long goes out again (the agent restarted).
COMMANDS_REDELIVER_AFTER_S = envfloat("COMMANDS_REDELIVER_AFTER_S", 30.0)
# Held long-polls wake on a Redis message (apps/commands/wakeups.py); the database is looked
# at again this often as a safety net (a lost message, a delivery due again, a new node).
COMMANDS_RECHECK_S = envfloat("COMMANDS_RECHECK_S", 5.0)
# How often a long-poll served by WSGI looks at the database while Redis is unreachable.
COMMANDS_POLL_INTERVAL_S = envfloat("COMMANDS_POLL_INTERVAL_S", 0.2)
COMMANDS_SWEEP_INTERVAL = envfloat("COMMANDS_SWEEP_INTERVAL", 2.0)
# A node command (cordon, uncordon, drain) still issued this long after it was issued is
# sent to its task again by the sweep (its message was lost, or its worker died).
COMMANDS_NODE_RETRY_AFTER_S = envfloat("COMMANDS_NODE_RETRY_AFTER_S", 10.0)
# A drain's phases have deadlines of their own: its checkpoint of each run, then the stop.
COMMANDS_DRAIN_CHECKPOINT_S = envfloat("COMMANDS_DRAIN_CHECKPOINT_S", 600.0)
COMMANDS_DRAIN_STOP_S = envfloat("COMMANDS_DRAIN_STOP_S", 300.0)
beat_schedule["commands-sweep"] = periodic("commands.sweep", COMMANDS_SWEEP_INTERVAL)
# The sweep re-applies the newest successful stop or resume of each run within this long,
# in case the run's update after the command's end was lost (apps/commands/services/reactions).
COMMANDS_RUN_REPLAY_S = envfloat("COMMANDS_RUN_REPLAY_S", 600.0)
# Each cluster's scheduler state hook (ClusterHooks.state_argv) runs this often: nodes the
# scheduler reports down leave run plans (docs/actions.md).
COMMANDS_STATE_HOOK_INTERVAL = envfloat("COMMANDS_STATE_HOOK_INTERVAL", 30.0)
beat_schedule["commands-scheduler-states"] = periodic(
    "commands.scheduler_states_poll_all", COMMANDS_STATE_HOOK_INTERVAL
)

# --- History: rollups and retention --------------------------------------------------------
# Days each resolution is kept; 0 or empty keeps it forever. Raw = sample chunks and step
# reports; late data older than the raw retention never reaches the rollups (docs/history.md).
HISTORY_RAW_RETENTION_DAYS = float(env("HISTORY_RAW_RETENTION_DAYS", "7") or 0)
HISTORY_10S_RETENTION_DAYS = float(env("HISTORY_10S_RETENTION_DAYS", "2") or 0)
HISTORY_1M_RETENTION_DAYS = float(env("HISTORY_1M_RETENTION_DAYS", "90") or 0)
HISTORY_10M_RETENTION_DAYS = float(env("HISTORY_10M_RETENTION_DAYS", "400") or 0)
HISTORY_1H_RETENTION_DAYS = float(env("HISTORY_1H_RETENTION_DAYS", "0") or 0)
# How often dirty buckets are rolled up: charts read raw data for the newest part of a range,
# so this bounds how stale a replayed (late) bucket can look, not how current charts are.
HISTORY_ROLLUP_INTERVAL = envfloat("HISTORY_ROLLUP_INTERVAL", 10.0)
# Dirty ranges a rollup round claims. A round recomputes each touched minute once, however
# many batches marked it, and each touched hour from its minutes: with 20 k-row rounds a pass
# under full ingest took ~7 rounds and recomputed the same open minutes and hours in each
# (3.5 µs of Postgres CPU per sample; one round: 1.0). Bounds a round's memory and time.
HISTORY_ROLLUP_CLAIM_ROWS = envint("HISTORY_ROLLUP_CLAIM_ROWS", 200_000)
HISTORY_PRUNE_INTERVAL = envfloat("HISTORY_PRUNE_INTERVAL", 300.0)
# Rows one pruning DELETE removes (one transaction each), and the most batches per table a run.
HISTORY_PRUNE_BATCH = envint("HISTORY_PRUNE_BATCH", 20_000)
HISTORY_PRUNE_MAX_BATCHES = envint("HISTORY_PRUNE_MAX_BATCHES", 50)
beat_schedule["history-rollup"] = periodic("history.rollups_refresh", HISTORY_ROLLUP_INTERVAL)
beat_schedule["history-prune"] = periodic("history.prune", HISTORY_PRUNE_INTERVAL)
# The time tables' partitions (apps/history/services/retention.py) are made a week ahead and
# dropped once expired, this often; a drop or a make waits at most this long for its lock on
# the table (the next pass tries again), so that no reader queues the ingest behind it.
PARTITIONS_MAINTAIN_INTERVAL = envfloat("PARTITIONS_MAINTAIN_INTERVAL", 3600.0)
PARTITION_LOCK_TIMEOUT_MS = envint("PARTITION_LOCK_TIMEOUT_MS", 2000)
beat_schedule["history-partitions"] = periodic(
    "history.partitions_maintain", PARTITIONS_MAINTAIN_INTERVAL
)
# processed inbox rows, once their batch_id can no longer matter (apps/ingest/services/prune.py)
beat_schedule["inbox-prune"] = periodic("ingest.inbox_prune", HISTORY_PRUNE_INTERVAL)
# Step reports move into per-rank columnar chunks (apps/runs/compaction.py) of this many
# seconds once older than STEP_COMPACT_AFTER_S, except each run's last STEP_COMPACT_KEEP_STEPS
# steps: readers of "the last N steps" (the detectors' window, goodput, a run's nodes and
# ranks' places, commands' serving nodes) then always find them raw. It must exceed
# ALERT_STEP_WINDOW and runs.selectors.PLACE_STEPS (checked by the compaction).
STEP_CHUNK_SECONDS = envint("STEP_CHUNK_SECONDS", 600)
STEP_COMPACT_AFTER_S = envfloat("STEP_COMPACT_AFTER_S", 600.0)
STEP_COMPACT_KEEP_STEPS = envint("STEP_COMPACT_KEEP_STEPS", 200)
STEP_COMPACT_INTERVAL = envfloat("STEP_COMPACT_INTERVAL", 60.0)
beat_schedule["steps-compact"] = periodic("runs.steps_compact", STEP_COMPACT_INTERVAL)
# How often the step completions of newly stored steps are recomputed (apps/runs/completions.py):
# goodput reads raw reports for the steps stored since, so this bounds a goodput read's cost
# (at 16,384 ranks and a step a second, ~16 k reports a second waiting), not its freshness.
STEP_COMPLETIONS_INTERVAL = envfloat("STEP_COMPLETIONS_INTERVAL", 3.0)
beat_schedule["step-completions"] = periodic("runs.completions_refresh", STEP_COMPLETIONS_INTERVAL)

# --- Retention of everything else that grows (docs/operations.md, Retention) --------------
# Days kept; 0 or empty keeps them forever. Pruned by beat's retention tasks every
# RETENTION_INTERVAL seconds, RETENTION_BATCH rows a statement (a transaction each), at most
# RETENTION_MAX_BATCHES statements per table and pass (the next pass goes on).
# Run events: those of runs neither stepping nor ended for this long, and node events (no run).
RUN_EVENTS_RETENTION_DAYS = float(env("RUN_EVENTS_RETENTION_DAYS", "90") or 0)
# ... and within a run, the newest this many of each kind (the newest checkpoint of each tier
# and state is always kept: staleness needs it); 0: no cap.
RUN_EVENTS_MAX_PER_RUN = envint("RUN_EVENTS_MAX_PER_RUN", 10_000)
# Resolved alerts (with their webhook deliveries); firing and acknowledged ones stay.
ALERTS_RETENTION_DAYS = float(env("ALERTS_RETENTION_DAYS", "180") or 0)
# The maintenance ledger: a node back from maintenance that raises a critical finding within
# this many days is a repeat offender (docs/operations.md, "The maintenance ledger").
LEDGER_REPEAT_DAYS = float(env("LEDGER_REPEAT_DAYS", "7") or 0)
# Webhook deliveries, by their creation (none is attempted after a day).
WEBHOOK_DELIVERIES_RETENTION_DAYS = float(env("WEBHOOK_DELIVERIES_RETENTION_DAYS", "30") or 0)
# Finished commands (succeeded, failed, expired: by finished_at) with their transitions.
COMMANDS_RETENTION_DAYS = float(env("COMMANDS_RETENTION_DAYS", "180") or 0)
# Successful and failed logins (django-axes' access logs); expired sessions go at every pass.
LOGIN_LOG_RETENTION_DAYS = float(env("LOGIN_LOG_RETENTION_DAYS", "90") or 0)
# The audit log: pruned only by `manage.py audit_prune` run as the table's owner (cron), never
# by the running services (docs/security.md); AUDIT_PRUNE_BATCH entries a statement.
AUDIT_RETENTION_DAYS = float(env("AUDIT_RETENTION_DAYS", "400") or 0)
AUDIT_PRUNE_BATCH = envint("AUDIT_PRUNE_BATCH", 10_000)
RETENTION_INTERVAL = envfloat("RETENTION_INTERVAL", 3600.0)
RETENTION_BATCH = envint("RETENTION_BATCH", 5_000)
RETENTION_MAX_BATCHES = envint("RETENTION_MAX_BATCHES", 100)
beat_schedule["run-events-prune"] = periodic("runs.events_prune", RETENTION_INTERVAL)
beat_schedule["alerts-prune"] = periodic("alerts.prune", RETENTION_INTERVAL)
beat_schedule["commands-prune"] = periodic("commands.prune", RETENTION_INTERVAL)
beat_schedule["logins-prune"] = periodic("access.logins_prune", RETENTION_INTERVAL)

# --- Ingest ------------------------------------------------------------------------------
INGEST_MAX_BODY_BYTES = envint("INGEST_MAX_BODY_BYTES", 8 * 1024 * 1024)
INGEST_MAX_RECORDS = envint("INGEST_MAX_RECORDS", 20_000)
# An unprocessed inbox row older than this is re-enqueued by the sweep (lost task, Redis down).
INGEST_SWEEP_AGE = envfloat("INGEST_SWEEP_AGE", 30.0)
# How many inbox rows one worker transaction drains when a backlog builds up. A drain pays
# a fixed cost (claim, node upserts, health merge, Redis, commit) that 40 rows share better
# than 20: 2.8-3.1 -> 2.4 µs of worker CPU per sample (docs/performance-history.md).
INGEST_DRAIN_ROWS = envint("INGEST_DRAIN_ROWS", 40)
# Backpressure (apps/ingest/services/backpressure.py): a POST waits up to the seconds while
# more rows than this wait in the inbox, about a quarter of a second of draining at ~200
# batches/s (live lag p99 303-357 ms at 48 rows with 40-row drains, 281-293 at 24 with 20;
# docs/performance-history.md); 0: off. Above one drain's worth, so that a drain's claim is full.
INGEST_BACKLOG_ROWS = envint("INGEST_BACKLOG_ROWS", 48)
INGEST_BACKLOG_WAIT_S = envfloat("INGEST_BACKLOG_WAIT_S", 2.0)
# One drain task is pending per queue at a time (a Redis flag, leased for this many seconds).
# The lease is short: a task that no worker will run (lost with a killed worker, or taken
# by another deployment on the same queue) blocks new wake-ups for at most this long; a
# spare task when a queued one outlives it costs one empty claim. A task drains until the
# inbox is empty, at most this many transactions and seconds, then hands on.
INGEST_DRAIN_PENDING_TTL = envfloat("INGEST_DRAIN_PENDING_TTL", 1.0)
INGEST_DRAIN_TASK_ROUNDS = envint("INGEST_DRAIN_TASK_ROUNDS", 10)
INGEST_DRAIN_TASK_SECONDS = envfloat("INGEST_DRAIN_TASK_SECONDS", 1.0)
# Django's own cap must not cut a body before the ingest middleware judges it.
DATA_UPLOAD_MAX_MEMORY_SIZE = INGEST_MAX_BODY_BYTES + 1024
INGEST_RETRY_AFTER = envint("INGEST_RETRY_AFTER", 5)
# Per-token rate limit on POST /api/v1/ingest (a token bucket in Redis, shared by every web
# worker): batches per second, and how many may come at once. A token is one cluster, whose
# agents send about one batch per node per few seconds: the default is far above that and only
# stops a runaway agent. 0 turns the limit off.
INGEST_RATE_PER_TOKEN = envfloat("INGEST_RATE_PER_TOKEN", 2000.0)
INGEST_RATE_BURST = envint("INGEST_RATE_BURST", 4000)
# Prometheus remote write (POST /api/v1/write, docs/contract.md): the label rules that map
# a series onto a node (the first of these labels it has; `instance` loses its `:port`), the
# labels never folded into a metric's name (a Prometheus's external labels), and the name
# suffixes of counters when the request carries no metadata for the family.
REMOTE_WRITE_NODE_LABELS = envlist("REMOTE_WRITE_NODE_LABELS", "opsboard_node,Hostname,instance")
REMOTE_WRITE_DROP_LABELS = frozenset(
    envlist("REMOTE_WRITE_DROP_LABELS", "prometheus,prometheus_replica,replica,cluster")
)
REMOTE_WRITE_COUNTER_SUFFIXES = envlist(
    "REMOTE_WRITE_COUNTER_SUFFIXES", "_total,_sum,_count,_bucket"
)
# Samples are merged into one chunk per series per this many seconds once the window is over.
TELEMETRY_CHUNK_SECONDS = envint("TELEMETRY_CHUNK_SECONDS", 600)
# The pages open their websocket on this port of the page's host (the ASGI server's, when it
# runs beside a WSGI server); empty: the page's own host and port (behind a proxy).
LIVE_WS_PORT = env("LIVE_WS_PORT")
LIVE_PUBLISH_INTERVAL = envfloat("LIVE_PUBLISH_INTERVAL", 0.1)
# A node is sent at most once per this many seconds; its later changes wait and coalesce.
LIVE_NODE_INTERVAL = envfloat("LIVE_NODE_INTERVAL", 1.0)
# A live websocket sends at most one message per this many seconds however many nodes,
# alerts or commands change: at most 1 / LIVE_SOCKET_FLUSH_S a second, 4 by default
# (apps.live.coalesce; docs/api.md).
LIVE_SOCKET_FLUSH_S = envfloat("LIVE_SOCKET_FLUSH_S", 0.25)
# The overview of a fleet (apps.dashboard.selectors.blocks): past this many nodes it shows
# blocks of nodes, not a card per node: by this node_info field (a rack, a row) where agents
# send it (`opsboard-agent run --info rack=r12`), else this many nodes consecutive by name.
OVERVIEW_NODE_CARDS = envint("OVERVIEW_NODE_CARDS", 256)
OVERVIEW_BLOCK_FIELD = env("OVERVIEW_BLOCK_FIELD", "rack")
OVERVIEW_BLOCK_NODES = envint("OVERVIEW_BLOCK_NODES", 32)
# An open websocket re-checks its login (logout, expiry, deactivation) this often at most.
LIVE_SESSION_CHECK_S = envfloat("LIVE_SESSION_CHECK_S", 3.0)
