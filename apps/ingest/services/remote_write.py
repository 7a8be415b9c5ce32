"""Prometheus remote write, after the view: a decoded WriteRequest becomes the contract's
ingest batches, one per node (split at INGEST_MAX_RECORDS), accepted into the inbox like
an agent's -- the same validation, durability and exactly-once storage by the same worker.

What remote write needs beyond an agent's batch is state per series (RemoteSeries): the
last sample a counter's rate is taken from, and the watermark under which a sample was
accepted before (a Prometheus resends what it is unsure of after a restart). Both are read
locked and written in the transaction that accepts the batches, so a request is taken
whole or not at all. A request sent again byte for byte (Prometheus retries the same
compressed body after a 5xx or a lost answer) is also recognised by its batch ids.
"""

from __future__ import annotations

import hashlib
import math
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.conf import settings
from django.db import connection, transaction

from apps.clusters.models import AgentToken
from apps.core.bounds import CODE_MAX, CODE_MIN, FLOAT_ABS_MAX
from apps.ingest.prompb import WriteRequest
from apps.ingest.schemas import FUTURE_LIMIT_S, PAST_LIMIT_S, BatchRejected, TooManyRecords
from apps.ingest.services import batch_accept
from apps.ingest.services.remote_series import (
    Mapped,
    Refused,
    family_names,
    rules,
    series_map,
)
from apps.ingest.validation import batch_validate
from opsboard_agent.collectors import dcgm
from opsboard_agent.collectors.events import ecc_event, last_xid_event
from opsboard_agent.collectors.series import RATE, XID
from opsboard_agent.rates import counter_rate
from opsboard_agent.records import sample

EXAMPLES_MAX = 20  # refused series named in an answer; the rest are counted
FAMILY_MAX_LENGTH = 1024
# pg_advisory_xact_lock(class, hash of token and node): one remote write per node at a time
NODE_LOCK_CLASS = 0x0B5C3
SEP = "/"  # neither a node name nor a metric holds one (the contract)


@dataclass
class WriteOutcome:
    """What became of one request's samples (the answer's body, docs/contract.md)."""

    samples: int = 0
    events: int = 0
    batches: int = 0
    replayed: int = 0  # at or before their series' watermark: accepted before
    dropped: int = 0  # not stored on purpose: staleness markers, NaN, DCGM blanks, buckets
    refused_series: int = 0
    refused_samples: int = 0
    examples: list[dict[str, str]] = field(default_factory=list)
    duplicate: bool = False
    _refused: set[int] = field(default_factory=set)

    def refuse(self, labels: dict[str, str], reason: str, samples: int) -> None:
        """Count `samples` of the series refused; the series is counted (and named) once."""
        self.refused_samples += samples
        if id(labels) in self._refused:
            return
        self._refused.add(id(labels))
        self.refused_series += 1
        if len(self.examples) < EXAMPLES_MAX:
            self.examples.append({"series": series_text(labels), "reason": reason})

    def body(self) -> dict[str, Any]:
        return {
            "accepted": {"samples": self.samples, "events": self.events},
            "batches": self.batches,
            "replayed": self.replayed,
            "dropped": self.dropped,
            "refused": {
                "series": self.refused_series,
                "samples": self.refused_samples,
                "examples": self.examples,
            },
        }


@dataclass
class _Series:
    key: str
    labels: dict[str, str]
    mapped: Mapped
    samples: list[tuple[int, float]]


@dataclass
class _NodeBatch:
    samples: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    states: dict[str, tuple[float, float]] = field(default_factory=dict)
    series: list[_Series] = field(default_factory=list)


class _SeenBefore(Exception):
    """The request's batches are in the inbox already: nothing of this one is kept."""


def remote_write_accept(
    *, token: AgentToken, body: bytes, request: WriteRequest, now: float | None = None
) -> WriteOutcome:
    """Map, deduplicate and accept one decoded request (see the module)."""
    now = time.time() if now is None else now
    outcome = WriteOutcome()
    for labels in request.histogram_series:
        outcome.refuse(labels, "native histograms are not stored; send classic buckets", 1)
    metadata = _metadata(token, request)
    series = _series_mapped(token, request, metadata, outcome)
    if not series:
        return outcome
    digest = hashlib.blake2b(body, digest_size=16).hexdigest()
    try:
        with transaction.atomic():
            previous = _states_locked(token, series)
            nodes = _nodes_built(series, previous, now, outcome)
            _batches_accept(token, digest, nodes, outcome)
            _states_save(token, nodes)
    except _SeenBefore:
        return WriteOutcome(duplicate=True)
    return outcome


def _metadata(token: AgentToken, request: WriteRequest) -> dict[str, str]:
    """Family → type for this request's series: what earlier requests' metadata said, and
    this one's (kept for later requests; a name too long for any metric is not kept)."""
    names = {labels.get("__name__", "") for labels, _ in request.series}
    wanted = {family for name in names for family in family_names(name)}
    told = {k: v for k, v in request.metadata.items() if 0 < len(k) <= FAMILY_MAX_LENGTH}
    with connection.cursor() as cursor:
        if told:
            names = sorted(told)
            cursor.execute(
                "INSERT INTO ingest_remotefamily (token_id, name, type)"
                " SELECT %s, n, t FROM unnest(%s::text[], %s::text[]) AS u(n, t)"
                " ON CONFLICT (token_id, name) DO UPDATE SET type = excluded.type"
                " WHERE ingest_remotefamily.type <> excluded.type",
                [token.pk, names, [told[n] for n in names]],
            )
        if not wanted - told.keys():
            return told
        cursor.execute(
            "SELECT name, type FROM ingest_remotefamily WHERE token_id = %s AND name = ANY(%s)",
            [token.pk, sorted(wanted - told.keys())],
        )
        return {**dict(cursor.fetchall()), **told}


def _series_mapped(
    token: AgentToken, request: WriteRequest, metadata: dict[str, str], outcome: WriteOutcome
):
    series: dict[str, _Series] = {}
    allowed: dict[str, bool] = {}
    current = rules()
    for labels, samples in request.series:
        mapped = series_map(labels, metadata, current)
        if mapped is None:
            outcome.dropped += len(samples)
            continue
        if isinstance(mapped, Refused):
            outcome.refuse(labels, str(mapped), len(samples))
            continue
        node = mapped.node
        if node not in allowed:
            allowed[node] = token.acts_for(node)
        if not allowed[node]:
            reason = f"node {node!r}: this token acts for other nodes only"
            outcome.refuse(labels, reason, len(samples))
            continue
        gpu = "" if mapped.plan.gpu is None else str(mapped.plan.gpu)
        key = SEP.join((node, mapped.plan.metric, gpu))
        known = series.get(key)
        if known is None:
            series[key] = _Series(key, labels, mapped, list(samples))
        elif known.labels == labels:  # Prometheus 2 sends each sample as a series of its own
            known.samples.extend(samples)
        else:  # two label sets that name one stored series: the first keeps it
            reason = f"stored as {mapped.plan.metric!r}, as another series is"
            outcome.refuse(labels, reason, len(samples))
    for entry in series.values():
        entry.samples.sort()
    return list(series.values())


def _states_locked(token: AgentToken, series: list[_Series]) -> dict[str, tuple[float, float]]:
    """The series' last samples, read under a lock per node of the token (a transaction
    advisory lock, taken in one order): a request that writes the same node waits, so no
    sample is taken twice, a series' first ones included (no row yet to lock)."""
    nodes = sorted({entry.mapped.node for entry in series})
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_advisory_xact_lock(%s, h)) FROM (SELECT DISTINCT"
            " hashtext(%s || '/' || n) AS h FROM unnest(%s::text[]) AS n ORDER BY h) AS l",
            [NODE_LOCK_CLASS, str(token.pk), nodes],
        )
        cursor.execute(
            "SELECT key, ts, value FROM ingest_remoteseries WHERE token_id = %s AND key = ANY(%s)",
            [token.pk, [entry.key for entry in series]],
        )
        return {key: (ts, value) for key, ts, value in cursor.fetchall()}


def _nodes_built(
    series: list[_Series], previous: dict[str, tuple[float, float]], now: float, outcome
) -> dict[str, _NodeBatch]:
    nodes: dict[str, _NodeBatch] = defaultdict(_NodeBatch)
    oldest, newest = now - PAST_LIMIT_S, now + FUTURE_LIMIT_S
    for entry in series:
        batch = nodes[entry.mapped.node]
        batch.series.append(entry)
        last = previous.get(entry.key)
        for ms, value in entry.samples:
            ts = ms / 1000.0
            if last is not None and ts <= last[0]:
                outcome.replayed += 1
                continue
            if not math.isfinite(value):  # staleness markers are NaN
                outcome.dropped += 1
                continue
            if not oldest <= ts <= newest:
                outcome.refuse(
                    entry.labels, "timestamp outside the accepted window (7 days back, 5 min on)", 1
                )
                continue
            if _sample_emit(entry, ts, value, last, batch, outcome):
                last = (ts, value)
        if last is not None and last != previous.get(entry.key):
            batch.states[entry.key] = last
    return nodes


def _sample_emit(entry: _Series, ts: float, value: float, last, batch: _NodeBatch, outcome):
    """Append the sample (or the rate, or the event) a value makes, by the agent's own rules
    (opsboard_agent.rates, .collectors.events); whether it was kept."""
    plan = entry.mapped.plan
    if plan.dcgm and dcgm.is_blank(value):
        outcome.dropped += 1
        return False
    before = None if last is None else last[1]
    if plan.kind is XID:
        if plan.gpu is not None and CODE_MIN <= value <= CODE_MAX:
            _append(batch.events, last_xid_event(ts, plan.gpu, before, value))
        return True
    if plan.kind is RATE:
        rate = None if last is None else counter_rate(last[0], last[1], ts, value)
        if rate is not None and rate <= FLOAT_ABS_MAX:  # never negative
            _append(batch.samples, sample(ts, plan.metric, rate, plan.gpu))
        return True
    stored = value * plan.factor
    if abs(stored) > FLOAT_ABS_MAX:
        outcome.refuse(entry.labels, f"value {value!r} beyond ±{FLOAT_ABS_MAX:g}", 1)
        return False
    _append(batch.samples, sample(ts, plan.metric, stored, plan.gpu))
    if plan.ecc and plan.gpu is not None:
        _append(batch.events, ecc_event(ts, plan.gpu, before, value, plan.ecc))
    return True


def _append(records: list, record: dict | None) -> None:
    if record is not None:
        records.append(record)


def _batches_accept(token, digest: str, nodes: dict[str, _NodeBatch], outcome) -> None:
    limit = settings.INGEST_MAX_RECORDS
    for node in sorted(nodes):
        batch = nodes[node]
        records = [("samples", r) for r in batch.samples] + [("events", r) for r in batch.events]
        node_digest = hashlib.blake2b(node.encode(), digest_size=6).hexdigest()
        payloads = []
        for part, start in enumerate(range(0, len(records), limit)):
            chunk = records[start : start + limit]
            payload = orjson.dumps(
                {
                    "batch_id": f"rw:{digest}:{node_digest}:{part}",
                    "node": node,
                    "samples": [r for kind, r in chunk if kind == "samples"],
                    "events": [r for kind, r in chunk if kind == "events"],
                }
            )
            try:
                batch_validate(payload)
            except (BatchRejected, TooManyRecords) as exc:
                # built from bounded values, so not expected: the node's series are refused
                # with the contract's own words, and its state is left as it was
                reason = f"not a valid batch: {getattr(exc, 'errors', exc)}"[:500]
                for entry in batch.series:
                    outcome.refuse(entry.labels, reason, len(entry.samples))
                batch.states.clear()
                payloads = []
                break
            payloads.append((f"rw:{digest}:{node_digest}:{part}", payload))
        for batch_id, payload in payloads:
            # kept compressed, as an agent's gzip body is: a fifth of the bytes for Postgres
            # to write (and not to compress itself)
            stored = zlib.compress(payload, 1, wbits=31)
            if (
                batch_accept(token=token, batch_id=batch_id, payload=stored, encoding="gzip")
                is None
            ):
                raise _SeenBefore
            outcome.batches += 1
        if payloads:
            outcome.samples += len(batch.samples)
            outcome.events += len(batch.events)


def _states_save(token: AgentToken, nodes: dict[str, _NodeBatch]) -> None:
    states = sorted((k, v) for batch in nodes.values() for k, v in batch.states.items())
    if not states:
        return
    keys = [key for key, _ in states]
    times = [ts for _, (ts, _) in states]
    values = [value for _, (_, value) in states]
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ingest_remoteseries (token_id, key, ts, value)"
            " SELECT %s, k, t, v FROM unnest(%s::text[], %s::float8[], %s::float8[]) AS u(k, t, v)"
            " ON CONFLICT (token_id, key) DO UPDATE SET ts = excluded.ts, value = excluded.value"
            " WHERE excluded.ts > ingest_remoteseries.ts",
            [token.pk, keys, times, values],
        )


def series_text(labels: dict[str, str]) -> str:
    """`name{label="value",...}` as Prometheus writes a series, cut at 200 characters."""
    name = labels.get("__name__", "")
    rest = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{rest}}}"[:200]
