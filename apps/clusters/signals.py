"""Signals of the clusters app. It is the lowest layer and imports no other app, so the
apps above it (the audit log) hear of its changes through these."""

from django.dispatch import Signal

# Sent inside the transaction of apps.clusters.services.token_issue and token_revoke (a
# revoke only when it revoked), with `action` ("issue" | "revoke"), `token` (plain data:
# {"id", "name", "prefix", "cluster_id", "cluster_name"}), `actor` (the user who acted; None:
# the command line) and `request` (or None). Sent with send, not send_robust: a receiver
# that fails undoes the change, so no token is issued or revoked unaudited.
agent_token_changed = Signal()
