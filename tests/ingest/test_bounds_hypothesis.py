"""Bodies generated from the edges of the ingest schema, posted to the live stack: every
answer is either 202 and the worker stores the batch (processed, not quarantined, every
record present), or a 4xx whose errors name only fields that were changed."""

from __future__ import annotations

import json
import math
import re
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.clusters.services import token_issue
from apps.core import bounds
from apps.core.errors import loc_string
from tests.conftest import AgentClient
from tests.ingest.test_bounds import assert_stored

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]

NUL = "a\x00b"


class Raw(str):
    """A JSON token written as is (1e999: finite text, infinite value)."""


def ints(low: int, high: int) -> list:
    return [low - 1, low, high, high + 1, 2**64, -(2**63) - 1, float(low), str(low), True]


def floats(low: float, high: float) -> list:
    return [
        low,
        high,
        math.nextafter(high, math.inf),
        math.nextafter(low, -math.inf),
        int(high),
        1.7e308,
        -1.7e308,
        math.nan,
        math.inf,
        -math.inf,
        Raw("1e999"),
        "1.5",
        True,
    ]


def strings(max_length: int, min_length: int = 0) -> list:
    return ["x" * max_length, "é" * max_length, "x" * (max_length + 1), NUL, "\u2028", ""]


NAMES = [
    "node-07",
    ".",
    "..",
    "...",
    ".hidden",
    "gpu_node:01",
    "é" * bounds.NAME_MAX_LENGTH,
    "x" * (bounds.NAME_MAX_LENGTH + 1),
    "a/b",
    "a\\b",
    "a?b",
    "a#b",
    "a%41",
    "a b",
    "a\u00a0b",
    "a\x7fb",
    NUL,
    "",
]
STORABLE = [
    "ok",
    2**53,
    -(2**53),
    1e150,
    False,
    None,
    [1, "a", None, {"k": 2.5}],
    "x" * bounds.MESSAGE_MAX_LENGTH,
]
UNSTORABLE = [
    math.nan,
    math.inf,
    Raw("-1e999"),
    NUL,
    {"k": [NUL]},
    {"\x00": 1},
    2**53 + 1,
    1.7e308,
    "x" * (bounds.MESSAGE_MAX_LENGTH + 1),
    [[[[[[[[[1]]]]]]]]],
]
SCALAR_EXTRAS = [
    "x" * bounds.EXTRA_STR_MAX_LENGTH,
    "x" * (bounds.EXTRA_STR_MAX_LENGTH + 1),
    NUL,
    True,
    None,
    2**53,
    2**53 + 1,
    1.5,
    math.nan,
    [1],
    {"a": 1},
]
# (path into the body, values to put there: inside, at and past each bound)
EDGES: list[tuple[tuple, list]] = [
    (("batch_id",), strings(bounds.BATCH_ID_MAX_LENGTH)),
    (("node",), NAMES),
    (("run",), NAMES),
    (("node_info", "gpus"), ints(0, bounds.MAX_GPUS) + [3_000_000]),
    (("node_info", "cpus"), ints(0, bounds.CPUS_MAX)),
    (("node_info", "mem_bytes"), ints(0, bounds.MEM_BYTES_MAX)),
    (("node_info", "gpu_model"), strings(bounds.GPU_MODEL_MAX_LENGTH)),
    (("node_info", "driver"), SCALAR_EXTRAS),
    (("node_info", "bad key"), [1]),
    (("node_info", "x\x00"), [1]),
    (("samples", 0, "ts"), [math.nan, math.inf, Raw("1e999"), "1764470000", 1e20, 0]),
    (("samples", 0, "gpu"), ints(0, bounds.GPU_MAX) + [32767, None]),
    (("samples", 0, "value"), floats(-bounds.FLOAT_ABS_MAX, bounds.FLOAT_ABS_MAX)),
    (("samples", 1, "value"), [1.7e308, 1e150, -1e150, 0]),
    (("samples", 0, "metric"), ["m" * 128, "m" * 129, NUL, "9bad", "DCGM_FI_DEV_GPU_UTIL"]),
    (("samples", 0, "note"), STORABLE + UNSTORABLE),
    (("steps", 0, "rank"), ints(0, bounds.RANK_MAX)),
    (("steps", 0, "step"), ints(0, bounds.STEP_MAX)),
    (("steps", 0, "tokens"), ints(0, bounds.TOKENS_MAX) + [None]),
    (("steps", 0, "step_time"), floats(0, bounds.SECONDS_MAX)),
    (("steps", 0, "comm_wait"), floats(0, bounds.SECONDS_MAX) + [None]),
    (("steps", 0, "loss"), floats(-bounds.FLOAT_ABS_MAX, bounds.FLOAT_ABS_MAX) + [None]),
    (("steps", 0, "grad_checksum"), ["f" * 64, "f" * 65, "xyz", NUL]),
    (("steps", 0, "shard"), strings(bounds.SHARD_MAX_LENGTH)),
    (("steps", 0, "canary", "norm"), floats(-bounds.FLOAT_ABS_MAX, bounds.FLOAT_ABS_MAX)),
    (("steps", 0, "canary", "proj"), [[1e150] * 64, [0.5] * 65, [math.nan], [1.7e308]]),
    (("steps", 0, "future"), STORABLE + UNSTORABLE),
    (("steps", 0, "\x00key"), [1]),
    (("events", 0, "step"), ints(0, bounds.STEP_MAX)),
    (("events", 0, "bytes"), ints(0, bounds.BYTES_MAX)),
    (("events", 0, "duration"), floats(0, bounds.SECONDS_MAX)),
    (("events", 0, "path"), strings(bounds.PATH_MAX_LENGTH)),
    (("events", 1, "gpu"), ints(0, bounds.GPU_MAX) + [32767]),
    (("events", 1, "code"), ints(bounds.CODE_MIN, bounds.CODE_MAX)),
    (("events", 1, "rank"), ints(0, bounds.RANK_MAX)),
    (("events", 2, "count"), ints(0, bounds.COUNT_MAX)),
    (("events", 3, "message"), strings(bounds.MESSAGE_MAX_LENGTH)),
    (("events", 3, "level"), strings(bounds.LEVEL_MAX_LENGTH)),
    (("events", 3, "context"), STORABLE + UNSTORABLE),
]


def base_body(now: float) -> dict:
    return {
        "batch_id": uuid.uuid4().hex,
        "node": "node-01",
        "run": "run-1",
        "node_info": {"gpus": 8, "gpu_model": "H100", "cpus": 96, "mem_bytes": 2**41},
        "samples": [
            {"ts": now - 1, "metric": "gpu.util", "gpu": 3, "value": 97.5},
            {"ts": now, "metric": "gpu.util", "gpu": 3, "value": 88.0},
        ],
        "steps": [
            {
                "ts": now,
                "rank": 0,
                "step": 100,
                "step_time": 0.8,
                "tokens": 4096,
                "loss": 2.5,
                "grad_checksum": "9f2c",
                "canary": {"norm": 3.0, "proj": [0.1, -0.2]},
            }
        ],
        "events": [
            {"ts": now, "kind": "checkpoint", "step": 100, "tier": "local", "state": "started"},
            {"ts": now, "kind": "xid", "gpu": 3, "code": 79},
            {"ts": now, "kind": "ecc", "gpu": 3, "count": 1},
            {"ts": now, "kind": "log", "message": "hello", "level": "info"},
        ],
    }


def encode(body: dict) -> bytes:
    """JSON with NaN/Infinity tokens for non-finite floats and Raw values unquoted."""
    raws: list[str] = []

    def mark(value):
        if isinstance(value, Raw):
            raws.append(str(value))
            return f"\x01{len(raws) - 1}\x01"
        if isinstance(value, dict):
            return {key: mark(item) for key, item in value.items()}
        if isinstance(value, list):
            return [mark(item) for item in value]
        return value

    text = json.dumps(mark(body), allow_nan=True)
    return re.sub(r'"\\u0001(\d+)\\u0001"', lambda m: raws[int(m[1])], text).encode()


def names_a_changed_field(error_loc: str, changed: list[str]) -> bool:
    return any(error_loc == loc or error_loc.startswith((f"{loc}.", f"{loc}[")) for loc in changed)


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_body_at_the_edges_is_stored_when_accepted_and_otherwise_refused_by_field(
    live_stack, live_db, data
):
    now = time.time()
    body = base_body(now)
    picks = data.draw(
        st.lists(st.sampled_from(range(len(EDGES))), min_size=1, max_size=3, unique=True)
    )
    changed = []
    for index in picks:
        path, values = EDGES[index]
        value = data.draw(st.sampled_from(values), label=loc_string(path))
        target = body
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        changed.append(loc_string(path))

    token, secret = token_issue(cluster_name=f"h-{uuid.uuid4().hex[:10]}")
    client = AgentClient(live_stack.url, secret)
    try:
        response = client.post(encode(body))
    finally:
        client.http.close()

    if response.status_code == 202:
        assert_stored(token, body)
    else:
        assert 400 <= response.status_code < 500, response.text
        locs = [item["loc"] for item in response.json()["errors"]]
        assert locs and all(names_a_changed_field(loc, changed) for loc in locs), (locs, changed)
