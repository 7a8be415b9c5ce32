"""How a command shows as a row of a page's command list. The template and the live
`command` message render the same dict, so a row drawn by the server and one redrawn by
static/js/commands.js read alike."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from apps.commands.models import Command
from apps.runs.models import Run

DETAIL_MAX = 300  # characters of the result shown in a row (the API has all of it)


def command_row(command: Command) -> dict[str, Any]:
    """Plain JSON: id, kind, state, cluster, run, run_state (the run's state when the row
    was read: a run page follows it), node, issued_by, issued_at (epoch s), issued_at_text
    (UTC), reason, detail (the result in one line). Needs cluster, run, node and issued_by
    loaded (apps.commands.selectors.command_get / command_list)."""
    return {
        "id": str(command.pk),
        "kind": command.kind,
        "state": command.state,
        "cluster": command.cluster.name,
        "run": command.run.name if command.run else None,
        "run_state": command.run.state if command.run else None,
        "node": command.node.name if command.node else None,
        "issued_by": command.issued_by.username if command.issued_by else "system",
        "issued_at": command.issued_at.timestamp(),
        "issued_at_text": utc_text(command.issued_at),
        "reason": command.reason,
        "detail": result_text(command.result),
    }


def run_header(run: Run) -> dict[str, Any]:
    """What a run page's header shows of the run, as static/js/commands.js redraws it: state,
    ended_at (epoch s, or None while it runs), ended_at_text (UTC), end_message."""
    ended = run.ended_at
    return {
        "state": run.state,
        "ended_at": ended.timestamp() if ended else None,
        "ended_at_text": utc_text(ended) if ended else "",
        "end_message": run.end_message,
    }


def utc_text(moment: datetime) -> str:
    """As the templates draw a time before timezone.js rewrites it: `Y-m-d H:i:s`, UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def result_text(result: dict[str, Any]) -> str:
    """The result in one line: `key: value` pairs, a scheduler hook as its exit code."""
    parts = [f"{key}: {_value_text(key, value)}" for key, value in result.items()]
    text = "; ".join(parts)
    return text if len(text) <= DETAIL_MAX else text[: DETAIL_MAX - 1] + "…"


def _value_text(key: str, value: Any) -> str:
    if key == "hook":
        if not value:
            return "none"
        if value.get("error"):
            return f"failed ({value['error']})"
        return f"exit {value.get('exit_code')}"
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) or "none"
    return str(value)
