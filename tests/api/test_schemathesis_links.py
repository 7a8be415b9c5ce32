"""Schemathesis' state machine over the served schema's OpenAPI links (docs/api.md#links):
scenarios of up to STEPS requests in which an answer's id or name is fed to the next
operation (a command issued, then read; a polled command acknowledged; an alert listed, then
acknowledged; a run, then its plan, alerts and nodes), as every identity of the stateless test
(tests/api/test_schemathesis.py), with its checks: no server error, nothing off the declared
answers, no object of the foreign cluster, and no 2xx for a credential the operation does
not take. Each step is checked as it is made, so a bypass that needs an earlier answer's id
(a command id read as one identity, acknowledged as the same) is caught too."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest
import schemathesis
from django.db import transaction
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import FlakyStrategyDefinition
from schemathesis.generation.stateful.state_machine import StepInput, StepOutput

from opsboard.wsgi import application
from tests.api.test_schemathesis import (
    CHECKS,
    POOLS,
    accepts,
    assert_nothing_foreign,
    one_connection,  # noqa: F401 (the fixture)
)
from tests.api.world import FOREIGN_RUN, HOME_RUN, IDENTITIES, World, build_world

pytestmark = pytest.mark.fuzz  # `make fuzz`; CI runs it once

# A schema of its own: building the state machine may add inferred links to the schema it
# reads, and the stateless test's must stay as served. Only the documented links are walked.
SCHEMA = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", application)
SCHEMA.config.phases.stateful.inference.algorithms = []
SCENARIOS = 100  # per identity, each a walk of up to STEPS requests
STEPS = 5
# How often a parameter no link filled names an existing object (the stateless test: half of
# the time): the walks are for what follows a found object; random names are fuzzed there.
AIM = 0.8
RESTARTS = 20


def aim_unlinked(case: schemathesis.Case, world: World, linked: set[str]) -> None:
    """As the stateless test's `aim`, for the parameters the link did not fill: AIM of the
    time an existing name or id of either cluster instead of a generated one. The coin is
    seeded by the generated values, so the same draw aims the same way each time."""
    drawn = [
        {key: value for key, value in values.items() if key not in linked}
        for values in (case.path_parameters, case.query, case.body)
        if isinstance(values, dict)
    ]
    coin = random.Random(json.dumps([case.operation.label, drawn], default=str, sort_keys=True))
    # an optional query parameter the generator left out is given one too, at times: an
    # agent's poll names its node, or it is a 400 that leads nowhere
    for name in sorted(parameter.name for parameter in case.operation.query):
        if name in POOLS and name not in linked and coin.random() < AIM / 2:
            case.query = case.query if isinstance(case.query, dict) else {}
            case.query.setdefault(name, coin.choice(getattr(world, POOLS[name])))
    containers = [case.path_parameters, case.query]
    if case.operation.label == "POST /api/v1/commands":
        containers.append(case.body)
    for values in containers:
        if not isinstance(values, dict):
            continue
        for key in sorted(values):
            if key in POOLS and key not in linked and coin.random() < AIM:
                values[key] = coin.choice(getattr(world, POOLS[key]))
    # a command without a run or node is a 400, one for a node's name as a run a 404: without
    # this, the walks after an issued command (read it, its run, its node) seldom start
    body = case.body
    issues = case.operation.label == "POST /api/v1/commands" and isinstance(body, dict)
    if issues and not {"run", "node"} & body.keys() and coin.random() < AIM:
        body["run"] = coin.choice([HOME_RUN, FOREIGN_RUN])


def walker(identity: str, world: World, seen: Counter) -> type:
    """The schema's state machine, calling as `identity` and checking every answer."""

    class Walk(SCHEMA.as_state_machine()):  # type: ignore[misc]
        scenarios = 0

        def setup(self) -> None:
            # every scenario starts from the same world: what one acknowledged or issued is
            # undone, so that the same draws meet the same answers (Hypothesis replays them)
            self.savepoint = transaction.savepoint()

        def teardown(self) -> None:
            transaction.savepoint_rollback(self.savepoint)
            type(self).scenarios += 1

        def step(self, input: StepInput) -> StepOutput:
            case = input.case
            linked = {name for _, name in input.applied_parameters if name}
            aim_unlinked(case, world, linked)
            if isinstance(case.query, dict) and isinstance(case.query.get("wait"), int | float):
                case.query["wait"] = 0  # a long-poll holds its answer up to `wait` seconds
            output = super().step(input)
            status = output.response.status_code
            followed = "linked" if input.transition is not None and linked else "drawn"
            seen[(followed, case.operation.label, "2xx" if status < 300 else status)] += 1
            return output

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"headers": world.identity.headers, "cookies": world.identity.cookies}

        def validate_response(self, response, case, additional_checks=None, **kwargs) -> None:
            case.validate_response(
                response, checks=CHECKS, transport_kwargs=kwargs or None, recorder=self.recorder
            )
            assert_nothing_foreign(case, response)
            assert "CSRF" not in response.text
            if not accepts(case.operation.label, identity):
                assert response.status_code >= 300, (
                    f"{identity} got {response.status_code} from {case.operation.label}"
                )

    return Walk


@pytest.mark.parametrize("identity", IDENTITIES)
def test_it_walks_the_links_within_the_schema(one_connection, identity):  # noqa: F811
    world = build_world(identity)
    seen: Counter = Counter()
    walk = walker(identity, world, seen)
    restarts = 0
    while walk.scenarios < SCENARIOS:
        try:
            walk.run(
                settings=settings(
                    max_examples=SCENARIOS - walk.scenarios,
                    stateful_step_count=STEPS,
                    # no shrinking, as the stateless test (minutes through the whole stack)
                    phases=[Phase.generate],
                    # reproducible (as with CI's profile), unless the walk had to start over
                    derandomize=restarts == 0,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )
            )
        except FlakyStrategyDefinition:
            # Whether a link is followed is Schemathesis' own coin (true random), and which
            # rules may run next depends on the answers it got: a replay of the same draws
            # can meet another set of rules. Not a failure (Schemathesis' runner carries on
            # too): the walk goes on with the scenarios left. A failed check is not caught.
            restarts += 1
            assert restarts <= RESTARTS, f"Hypothesis gave up {restarts} times: {dict(seen)}"
    requests = sum(seen.values())
    print(f"{identity}: {walk.scenarios} scenarios, {requests} requests, {restarts} restarts")
    for key in sorted(seen, key=str):
        print("   ", *key, seen[key])
    let_in = [label for followed, label, status in seen if followed == "linked" and status == "2xx"]
    if identity == "anonymous":
        assert not [key for key in seen if key[2] == "2xx"], seen
    else:
        # the walk went somewhere: an answer's value, fed by a link, was let in
        assert let_in, seen
