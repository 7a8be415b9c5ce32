"""Who may act on an alert: an operator of its cluster (apps.access). One rule for every act
(acknowledge, silence), each refusal recorded in the audit log under the act's name."""

from __future__ import annotations

from typing import Any

from apps.access.choices import Action
from apps.access.selectors import user_may
from apps.alerts.models import Alert
from apps.audit.choices import Outcome
from apps.audit.services import audit_record


def alert_act_authorize(
    *, user: Any, alert: Alert, action: str, reason: str = "", request: Any = None
) -> bool:
    """Whether the user may operate on the alert's cluster; a refusal is audited as `action`
    (an allowed attempt is recorded by the act itself)."""
    if user_may(user=user, cluster=alert.cluster, action=Action.OPERATE):
        return True
    audit_record(
        action=action, outcome=Outcome.DENIED, actor_user=user, cluster=alert.cluster,
        target=f"alert:{alert.pk}", reason=reason, request=request,
    )  # fmt: skip
    return False
