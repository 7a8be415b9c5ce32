"""Schemathesis against the served /api/v1/openapi.json: every operation as every identity
(cluster-wide and node-bound agent tokens, a viewer, operator and admin logged in with a
session and CSRF token, an operator's personal API token, and no one), 100 generated
requests each, through the whole Django stack in this process. No answer may be a server
error, break the operation's declared responses, or show an object of the foreign cluster
the identity holds no role on."""

from __future__ import annotations

import json
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from opsboard.wsgi import application
from tests.api.world import FOREIGN_COMMAND_IDS, FOREIGN_MARK, IDENTITIES, World, build_world

pytestmark = pytest.mark.fuzz  # `make fuzz`; CI runs it once

# POST /api/v1/write takes a snappy protobuf body: fuzzed as any bytes (its 4xx for a body
# that is not a WriteRequest, never a 500, is what the checks hold it to)
schemathesis.serializer.alias("application/x-protobuf", "application/octet-stream")
SCHEMA = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", application)
OPERATIONS = sorted(
    result.ok().label for result in SCHEMA.get_all_operations()
)  # an operation the schema cannot describe fails here, at collection
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
FOREIGN_TEXTS = (FOREIGN_MARK, *(str(command_id) for command_id in FOREIGN_COMMAND_IDS))
EXAMPLES = 100
# The parameters whose values the fuzzer also draws from both clusters' names and ids: random
# strings alone never name an existing object, and the authorisation check needs it to.
POOLS = {
    "name": "names",
    "node": "names",
    "run": "names",
    "cluster": "clusters",
    "alert_id": "alert_ids",
    "command_id": "command_ids",
}


def aim(values: dict[str, Any] | None, world: World, data: st.DataObject) -> None:
    """Replace, half of the time, a parameter named in POOLS by an existing name or id."""
    if not isinstance(values, dict):
        return
    for key in list(values):
        if key in POOLS and data.draw(st.booleans(), label=f"aim {key}"):
            values[key] = data.draw(st.sampled_from(getattr(world, POOLS[key])), label=key)


def accepts(label: str, identity: str) -> bool:
    """Whether the operation takes this identity's kind of credential (its `security`)."""
    method, path = label.split(" ", 1)
    schemes = {
        name
        for requirement in SCHEMA.raw_schema["paths"][path][method.lower()].get("security", [])
        for name in requirement
    }
    wanted = {
        "agent": "AgentBearer", "agent-node": "AgentBearer",
        "operator-token": "UserTokenBearer", "anonymous": None,
    }  # fmt: skip
    return wanted.get(identity, "SessionAuth") in schemes


def request_text(case: schemathesis.Case) -> str:
    return json.dumps([case.path_parameters, case.query, case.headers, case.body], default=str)


def assert_nothing_foreign(case: schemathesis.Case, response: schemathesis.Response) -> None:
    """An answer shows no foreign object: a success never names one, and an error only
    repeats what the request itself named."""
    asked = request_text(case)
    for text in FOREIGN_TEXTS:
        if text in response.text and (response.status_code < 300 or text not in asked):
            raise AssertionError(
                f"{case.operation.label} answered {response.status_code} with foreign {text!r}"
                f" for {asked}: {response.text[:2000]}"
            )


@pytest.fixture
def one_connection(db):
    """The WSGI handler closes the database connection after each request; the test's
    transaction lives on it, so (as Django's own test client does) it stays open."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.mark.parametrize("identity", IDENTITIES)
@pytest.mark.parametrize("label", OPERATIONS)
def test_it_answers_every_operation_within_its_schema(one_connection, label, identity):
    world = build_world(identity)
    operation = SCHEMA.find_operation_by_label(label)
    assert operation is not None
    let_in = accepts(label, identity)

    @settings(
        max_examples=EXAMPLES,
        # no shrinking: a failure is reported as found (shrinking a request through the
        # whole stack took many minutes), still reproducible (derandomized)
        phases=[Phase.explicit, Phase.generate],
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
        ],
    )
    @given(case=operation.as_strategy(), data=st.data())
    def fuzz(case: schemathesis.Case, data: st.DataObject) -> None:
        aim(case.path_parameters, world, data)
        aim(case.query, world, data)
        if label == "POST /api/v1/commands":
            aim(case.body, world, data)
        if isinstance(case.query, dict) and isinstance(case.query.get("wait"), int | float):
            case.query["wait"] = 0  # a long-poll holds its answer up to `wait` seconds
        response = case.call(headers=world.identity.headers, cookies=world.identity.cookies)
        case.validate_response(response, checks=CHECKS)
        assert_nothing_foreign(case, response)
        statuses.add(response.status_code)
        # a session sends its real CSRF token; a request without one is not a session's
        assert "CSRF" not in response.text

    statuses: set[int] = set()
    fuzz()
    if let_in:
        assert statuses - {401}, f"{identity} was never let in"
    else:
        assert not [status for status in statuses if status < 300], statuses
