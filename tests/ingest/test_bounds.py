"""The storage bounds at ingest, against the live stack: each poison value of issue 9 is
answered 400 naming its field and stores nothing; values at the edge of every bound are
answered 202 and stored by the worker (not quarantined, every record present)."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from django.db import connection

from apps.clusters.models import Node
from apps.core import bounds
from apps.ingest.models import InboxBatch
from apps.runs.models import Run, RunEvent, StepReport
from launcher.procs import wait_until
from tests.conftest import make_batch

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

NUL = "a\x00b"


def assert_stored(token, body: dict, timeout: float = 30) -> InboxBatch:
    """The worker stored the accepted batch: processed, not quarantined, every record there."""
    row = wait_until(
        lambda: InboxBatch.objects.filter(
            token=token, batch_id=body["batch_id"], processed_at__isnull=False
        ).first(),
        timeout,
        f"the worker to process batch {body['batch_id']!r}",
    )
    assert row.quarantined_at is None, f"quarantined: {row.error}"
    node = Node.objects.get(cluster=token.cluster, name=body["node"])
    if body.get("node_info") is not None:
        assert node.info == body["node_info"]
    assert StepReport.objects.filter(node=node).count() == len(body.get("steps", ()))
    assert RunEvent.objects.filter(node=node).count() == len(body.get("events", ()))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(n), 0) FROM telemetry_chunk WHERE node_id = %s", [node.pk]
        )
        assert cursor.fetchone()[0] == len(body.get("samples", ()))
    return row


def assert_refused(response, token, *locs: str) -> None:
    assert response.status_code == 400, response.text
    found = {item["loc"] for item in response.json()["errors"]}
    assert set(locs) <= found, found
    assert not InboxBatch.objects.filter(token=token).exists()
    assert not Node.objects.filter(cluster=token.cluster).exists()


def poison(**changes) -> dict:
    """A valid batch with a sample, a step and an xid event, then `changes` applied: a key
    `steps__0__rank` sets body["steps"][0]["rank"]."""
    body = make_batch(samples=2, steps=1, run="run-1")
    body["events"] = [{"ts": time.time(), "kind": "xid", "gpu": 0, "code": 79, "message": "m"}]
    for path, value in changes.items():
        *parents, last = [int(p) if p.isdigit() else p for p in path.split("__")]
        target = body
        for part in parents:
            target = target[part]
        target[last] = value
    return body


POISONS = {
    "NUL in node": (poison(node=NUL), "node"),
    "NUL in run": (poison(run=NUL), "run"),
    "NUL in batch_id": (poison(batch_id=NUL), "batch_id"),
    "NUL in metric": (poison(samples__0__metric=NUL), "samples[0].metric"),
    "NUL in shard": (poison(steps__0__shard=NUL), "steps[0].shard"),
    "NUL in message": (poison(events__0__message=NUL), "events[0].message"),
    "NUL in gpu_model": (poison(node_info={"gpu_model": NUL}), "node_info.gpu_model"),
    "step 2**63": (poison(steps__0__step=2**63), "steps[0].step"),
    "rank 2**31": (poison(steps__0__rank=2**31), "steps[0].rank"),
    "tokens 2**63": (poison(steps__0__tokens=2**63), "steps[0].tokens"),
    "value 1.7e308": (poison(samples__1__value=1.7e308), "samples[1].value"),
    "loss -1.7e308": (poison(steps__0__loss=-1.7e308), "steps[0].loss"),
    "step_time 1e300": (poison(steps__0__step_time=1e300), "steps[0].step_time"),
    "node_info.gpus 3000000": (poison(node_info={"gpus": 3_000_000}), "node_info.gpus"),
    "sample gpu 32767": (poison(samples__0__gpu=32767), "samples[0].gpu"),
    "event gpu 32767": (poison(events__0__gpu=32767), "events[0].gpu"),
    "xid code 2**31": (poison(events__0__code=2**31), "events[0].code"),
    "node_info list extra": (poison(node_info={"gpus": 8, "pci": [1, 2]}), "node_info.pci"),
    "node_info NUL extra": (poison(node_info={"driver": NUL}), "node_info.driver"),
    "node_info bad key": (poison(node_info={"a\x00": 1}), "node_info.a\x00"),
    "node_info 33 extras": (poison(node_info={f"k{i}": i for i in range(33)}), "node_info"),
    "node ..": (poison(node=".."), "node"),
    "node .": (poison(node="."), "node"),
    "node with a slash": (poison(node="a/b"), "node"),
    "run with ?": (poison(run="llama?v=2"), "run"),
    "run with #": (poison(run="llama#2"), "run"),
    "run with %": (poison(run="llama%2F"), "run"),
    "run with a tab": (poison(run="llama\t2"), "run"),
    "rank as a string": (poison(steps__0__rank="1"), "steps[0].rank"),
    "rank as a float": (poison(steps__0__rank=1.0), "steps[0].rank"),
    "value as a bool": (poison(samples__0__value=True), "samples[0].value"),
    "unknown field with NUL": (poison(events__0__note=NUL), "events[0].note"),
    "unknown field nested NUL": (poison(steps__0__extra={"k": [NUL]}), "steps[0].extra"),
}


@pytest.mark.parametrize("case", POISONS, ids=list(POISONS))
def test_it_refuses_each_poison_value_naming_the_field(agent, agent_token, case):
    body, loc = POISONS[case]
    body = {**body, "batch_id": body["batch_id"] if loc == "batch_id" else uuid.uuid4().hex}
    assert_refused(agent.post(body), agent_token[0], loc)


@pytest.mark.parametrize(
    ("token", "loc"),
    [
        ("NaN", "samples[0].note"),
        ("Infinity", "samples[0].note"),
        ("-Infinity", "events[0].note"),
        ("1e999", "steps[0].note"),
        ("-1e999", "node_info.note"),
    ],
)
def test_it_refuses_non_finite_json_tokens_in_unknown_fields(agent, agent_token, token, loc):
    """The worker parses the stored body with orjson, which refuses these tokens: a batch
    that carried one in a field the validator skipped would fail there on every retry."""
    body = poison(node_info={"gpus": 8})
    record = loc.split(".")[0]
    raw = json.dumps(body)
    if record == "node_info":
        raw = raw.replace('"gpus": 8', f'"gpus": 8, "note": {token}')
    else:
        name, index = record.rstrip("]").split("[")
        body[name][int(index)]["note"] = "PLACEHOLDER"
        raw = json.dumps(body).replace('"PLACEHOLDER"', token)
    assert_refused(agent.post(raw.encode()), agent_token[0], loc)


def test_it_refuses_gzip_poison_like_plain_json(agent, agent_token):
    response = agent.post(poison(steps__0__step=2**63), gzip_body=True)
    assert_refused(response, agent_token[0], "steps[0].step")


def test_it_stores_values_at_the_edge_of_every_bound(agent, agent_token):
    now = time.time()
    name = ".é-node~" + "n" * (bounds.NAME_MAX_LENGTH - 8)
    body = {
        "batch_id": "b" * bounds.BATCH_ID_MAX_LENGTH,
        "node": name,
        "run": "...",
        "node_info": {
            "gpus": bounds.MAX_GPUS,
            "gpu_model": "g" * bounds.GPU_MODEL_MAX_LENGTH,
            "cpus": bounds.CPUS_MAX,
            "mem_bytes": bounds.MEM_BYTES_MAX,
            "driver": "d" * bounds.EXTRA_STR_MAX_LENGTH,
            "cuda.version": 12.4,
            "mig": False,
            "serial": None,
            **{f"k{i}": -bounds.JSON_INT_MAX for i in range(bounds.NODE_INFO_MAX_EXTRAS - 4)},
        },
        "samples": [
            {"ts": now - 1, "metric": "gpu.util", "gpu": bounds.GPU_MAX, "value": 1e150},
            {"ts": now, "metric": "gpu.util", "gpu": bounds.GPU_MAX, "value": 1e150},
            {"ts": now, "metric": "m" * 128, "value": -1e150, "unit": "%"},
        ],
        "steps": [
            {
                "ts": now,
                "rank": bounds.RANK_MAX,
                "step": bounds.STEP_MAX,
                "step_time": bounds.SECONDS_MAX,
                "data_time": 0,
                "tokens": bounds.TOKENS_MAX,
                "loss": -1e150,
                "grad_checksum": "f" * 64,
                "shard": "s" * bounds.SHARD_MAX_LENGTH,
                "canary": {"norm": 1e150, "proj": [-1e150] * 64},
                "future": {"nested": [1, "two", None, {"x": 2.5}]},
            }
        ],
        "events": [
            {
                "ts": now,
                "kind": "checkpoint",
                "step": bounds.STEP_MAX,
                "tier": "durable",
                "state": "completed",
                "path": "/" + "p" * (bounds.PATH_MAX_LENGTH - 1),
                "bytes": bounds.BYTES_MAX,
                "duration": bounds.SECONDS_MAX,
            },
            {"ts": now, "kind": "xid", "gpu": bounds.GPU_MAX, "code": bounds.CODE_MIN},
            {"ts": now, "kind": "ecc", "gpu": 0, "count": bounds.COUNT_MAX},
            {
                "ts": now,
                "kind": "log",
                "message": "é" * bounds.MESSAGE_MAX_LENGTH,
                "level": "l" * bounds.LEVEL_MAX_LENGTH,
                "extra": "kept",
            },
        ],
    }
    response = agent.post(body)
    assert response.status_code == 202, response.text
    assert_stored(agent_token[0], body)
    run = Run.objects.get(cluster=agent_token[0].cluster, name="...")
    assert run.world_size == bounds.INT4_MAX and run.last_step == bounds.STEP_MAX
    log = RunEvent.objects.get(node__name=name, kind="log")
    assert log.data["extra"] == "kept"
