"""OpenAPI links: which value of an answer names the object another operation takes
(docs/api.md#links). Declared on the operation that answers, as its `openapi_extra`; the
targets are named by operationId, ninja's `<module>_<function>` (a renamed view breaks the
link, and the stateful fuzz test, tests/api/test_schemathesis_links.py, fails on it)."""

from typing import Any

# The targets, by what they are, so that a link reads as a sentence.
RUN = "apps_runs_api_run_detail"
PLAN = "apps_commands_api_plan"
NODE_SERIES = "apps_telemetry_api_node_series"
SERIES = "apps_telemetry_api_series"
ALERTS = "apps_alerts_api_alerts"
ALERT_ACK = "apps_alerts_api_alert_ack"
COMMANDS = "apps_commands_api_commands"
COMMAND = "apps_commands_api_command_detail"
COMMAND_ACK = "apps_commands_api_command_ack"


def link(operation_id: str, description: str, **parameters: str) -> dict[str, Any]:
    """One link: the target operation, and each of its parameters as a runtime expression
    (`$response.body#/id`, `$request.query.cluster`)."""
    return {"operationId": operation_id, "description": description, "parameters": parameters}


def links(statuses: tuple[int, ...], **named: dict[str, Any]) -> dict[str, Any]:
    """`openapi_extra` giving each of these answers the named links."""
    return links_each(dict.fromkeys(statuses, named))


def links_each(table: dict[int, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """`openapi_extra` giving each answer its own links. Ninja keys its responses by int, and
    merges this into them: string keys would add a second "200"."""
    return {"responses": {status: {"links": named} for status, named in table.items()}}
