"""Signals that let one app react to another's news without importing it.

apps.alerts and apps.commands are siblings (neither may import the other): alerts sends,
commands (the auto-cordon policy) receives. The payloads are plain data, never models."""

from django.dispatch import Signal

# Sent by apps.alerts on commit, once per alert that opened or escalated (its severity rose),
# with `alert`: {"id", "cluster_id", "node_id", "run_id", "kind", "subject", "severity",
# "summary", "evidence", "event"} (event: "opened" | "escalated"). Receivers run in the
# evaluation pass that raised the alert, after its transaction committed; sent with
# send_robust, so a failing receiver is logged and never undoes or stops the pass.
alert_raised = Signal()

# Sent by apps.access on commit, once per cluster role removed (apps.access.services.role_revoke),
# with `user_id` and `cluster_id` (ints). apps.live listens: the user's websockets on that
# cluster close at once unless another grant (superuser) still shows it. Sent with
# send_robust: a failing receiver is logged and never undoes the removal.
role_revoked = Signal()
