"""The hot path's fast check (apps.ingest.validation) never accepts a body the models refuse,
and what `batch_validate` answers (counts, or the contract's errors) is what the models
answer, for valid batches and for batches with one or more fields broken or added."""

from __future__ import annotations

import json
import time
from typing import Annotated

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import AfterValidator, ConfigDict, StringConstraints, create_model

from apps.core import bounds
from apps.ingest import validation
from apps.ingest.schemas import BatchRejected, IngestBatch, TooManyRecords
from tests.conftest import make_batch

NOW = time.time()

# Values at, inside and outside the bounds of every kind of field, and wrong types.
VALUES = st.sampled_from(
    [
        None,
        0,
        1,
        -1,
        7,
        63,
        64,
        bounds.RANK_MAX,
        bounds.RANK_MAX + 1,
        bounds.TOKENS_MAX,
        bounds.TOKENS_MAX + 1,
        2**63,
        0.5,
        1e150,
        1e151,
        -1e151,
        bounds.SECONDS_MAX + 1,
        NOW,
        NOW + 600,
        NOW - 8 * 86400,
        True,
        "",
        "x",
        "a\x00b",
        "gpu.util",
        "bad metric",
        "deadbeef",
        "node-1",
        "..",
        "a/b",
        "checkpoint",
        "run_end",
        "xid",
        "durable",
        "finished",
        "started",
        [],
        [1.0, 2.0],
        {},
        {"k": 1},
        "x" * 300,
        # Python's `$` also matches before a final newline, pydantic-core's does not
        "gpu.util\n",
        "node-1\n",
        "deadbeef\n",
        "node\u00a0x",
        "node\u2028",
        "\u00e9t\u00e9",
        1.7e308,
        -1.7e308,
    ]
)
RECORD_KEYS = ("ts", "metric", "gpu", "value", "rank", "step", "step_time", "tokens", "loss")
MORE_KEYS = ("grad_checksum", "canary", "shard", "kind", "tier", "state", "code", "count")
KEYS = st.sampled_from([*RECORD_KEYS, *MORE_KEYS, "message", "extra_field", "bad key", "x\x00"])
TOP_KEYS = st.sampled_from(["batch_id", "node", "run", "node_info", "samples", "steps", "events"])


def base_batch() -> dict:
    body = make_batch(samples=3, steps=2, run="run-1")
    body["events"] = [
        {"ts": NOW, "kind": "xid", "gpu": 1, "code": 79},
        {"ts": NOW, "kind": "checkpoint", "step": 5, "tier": "durable", "state": "completed"},
    ]
    body["node_info"] = {"gpus": 8, "gpu_model": "H100"}
    return body


@st.composite
def mutated_bodies(draw) -> bytes:
    body = base_batch()
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(["samples", "steps", "events", "node_info", "top"]))
        value = draw(VALUES)
        if where == "top":
            body[draw(TOP_KEYS)] = value
        elif where == "node_info":
            if isinstance(body.get("node_info"), dict):
                key = draw(st.sampled_from(["gpus", "cpus", "extra", "gpu_model"]))
                body["node_info"][key] = value
        elif isinstance(body.get(where), list) and body[where]:
            record = body[where][draw(st.integers(0, len(body[where]) - 1))]
            if isinstance(record, dict):
                record[draw(KEYS)] = value
    return json.dumps(body).encode()


def outcome(call) -> tuple:
    """("accepted", id, samples, steps, events), or the refusal and its errors."""
    try:
        return ("accepted", *call())
    except BatchRejected as error:
        return ("rejected", error.errors)
    except TooManyRecords as error:
        return ("too many", str(error))


def fast_outcome(body: bytes) -> tuple:
    def call():
        batch = validation.batch_validate(body)
        return batch.batch_id, batch.samples, batch.steps, batch.events

    return outcome(call)


def model_outcome(body: bytes) -> tuple:
    def call():
        batch = IngestBatch.model_validate_json(body)
        return batch.batch_id, len(batch.samples), len(batch.steps), len(batch.events)

    return outcome(call)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_bodies())
def test_the_fast_check_answers_as_the_models_do(body):
    assert fast_outcome(body) == model_outcome(body)


def test_a_valid_batch_passes_the_fast_check_without_the_models(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("the models were asked")

    monkeypatch.setattr(IngestBatch, "model_validate_json", refuse)
    accepted = validation.batch_validate(json.dumps(base_batch()).encode())
    assert (accepted.samples, accepted.steps, accepted.events) == (3, 2, 2)


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b["samples"][0].update(extra_field=1),  # a newer agent's field: models
        lambda b: b["node_info"].update(rack="r1"),
    ],
)
def test_extra_fields_go_through_the_models_and_are_accepted(change):
    body = base_batch()
    change(body)
    accepted = validation.batch_validate(json.dumps(body).encode())
    assert accepted.samples == 3


def test_a_cross_record_rule_broken_in_the_fast_check_is_answered_by_the_models():
    body = base_batch()
    del body["run"]
    with pytest.raises(BatchRejected) as raised:
        validation.batch_validate(json.dumps(body).encode())
    assert raised.value.errors == [{"loc": "run", "msg": "required when steps is not empty"}]


# Bodies that only a raw JSON text can hold: tokens, escapes and repeated keys.
RAW_BODIES = [
    b'"ts": NaN',
    b'"ts": Infinity',
    b'"ts": -Infinity',
    b'"ts": 1e999',
    b'"value": 1e999',
    b'"value": 2, "value": NaN',
    b'"metric": "gpu.util", "metric": "bad metric"',
    b'"metric": "bad metric", "metric": "gpu.util"',
    b'"metric": "gpu\\ud800"',
    b'"metric": "gpu\\u0000"',
    b'"gpu": 1.0',
    b'"gpu": 1e0',
    b'"gpu": 18446744073709551616',
    b'"value": 123456789012345678901234567890',
    b'"value": -0.0',
    b'"value": 1E+2',
]


@pytest.mark.parametrize("fragment", RAW_BODIES, ids=lambda f: f.decode())
def test_raw_json_the_fast_check_answers_as_the_models_do(fragment):
    fields = [b'"metric": "gpu.util"', b'"value": 1.0', fragment]
    if not fragment.startswith(b'"ts"'):
        fields.append(b'"ts": ' + json.dumps(NOW).encode())
    sample = b"{" + b", ".join(fields) + b"}"
    body = b'{"batch_id": "b-1", "node": "node-1", "samples": [' + sample + b"]}"
    assert fast_outcome(body) == model_outcome(body)


@pytest.mark.parametrize("suffix", [b"", b" ", b"\n", b"\r\n\t"])
def test_whitespace_around_the_body_is_answered_as_the_models_do(suffix):
    body = json.dumps(base_batch()).encode()
    assert fast_outcome(suffix + body + suffix) == model_outcome(suffix + body + suffix)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    where=st.sampled_from(["node", "run", "batch_id", "metric", "shard", "grad_checksum"]),
    text=st.text(max_size=12) | st.from_regex(bounds.NAME_PATTERN, fullmatch=True),
)
def test_any_text_in_a_patterned_field_is_answered_as_the_models_do(where, text):
    body = base_batch()
    if where in ("metric",):
        body["samples"][1][where] = text
    elif where in ("shard", "grad_checksum"):
        body["steps"][0][where] = text
    else:
        body[where] = text
    encoded = json.dumps(body).encode()
    assert fast_outcome(encoded) == model_outcome(encoded)


@pytest.mark.parametrize(
    "annotation",
    [
        Annotated[str, StringConstraints(to_lower=True)],
        Annotated[str, StringConstraints(pattern="[a-z]+")],  # unanchored
        Annotated[int, AfterValidator(lambda value: value)],
        dict[str, int],
    ],
    ids=["to_lower", "unanchored pattern", "a validator", "a dict"],
)
def test_a_constraint_the_mirror_cannot_express_fails_at_build_time(annotation):
    model = create_model("Odd", __config__=ConfigDict(strict=True), field=(annotation, ...))
    with pytest.raises(TypeError, match="no fast mirror"):
        validation._mirror(model, {})


def test_the_tighter_of_two_bounds_holds_in_the_mirror():
    # Real is finite (±1.8e308 in the mirror) and within ±1e150: the mirror keeps ±1e150
    body = base_batch()
    body["samples"][0]["value"] = 1e151
    encoded = json.dumps(body).encode()
    with pytest.raises(msgspec.ValidationError):
        validation._FAST.decode(encoded)
