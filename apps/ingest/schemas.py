"""The ingest batch of the contract (POST /api/v1/ingest), as pydantic models.

Validation here is complete: a batch that passes is stored by the worker without further
checks, so every rule of the contract that can make a batch invalid lives in this module.
The bounds it applies (what each column, rollup and page can take) live in
apps.core.bounds.

The models are strict: the worker stores the raw body, not these models, so a value that
pydantic would coerce ("1" or 1.0 for an integer, true for a number) is refused rather than
converted here and stored unconverted there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from django.conf import settings
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from apps.core.bounds import (
    EXTRA_KEY_PATTERN,
    NODE_INFO_MAX_EXTRAS,
    BatchId,
    Bytes,
    Checksum,
    Code,
    Count,
    CpuCount,
    ExtraKey,
    Gpu,
    GpuCount,
    GpuModel,
    Level,
    MemBytes,
    Message,
    Metric,
    Name,
    NodeInfoExtra,
    Path,
    Rank,
    Real,
    RecordExtra,
    Seconds,
    Shard,
    StepNumber,
    Tokens,
    bound_message,
)
from apps.core.errors import validation_errors

FUTURE_LIMIT_S = 5 * 60
PAST_LIMIT_S = 7 * 24 * 3600


class TooManyRecords(Exception):
    """Raised from validation (not a ValueError, so pydantic lets it through) → 413."""


class BatchRejected(Exception):
    """Raised from validation with the contract's error items (loc, msg) → 400."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        super().__init__(f"{len(errors)} invalid fields")
        self.errors = errors


# Checked in Rust by pydantic: no Python call per field (a 1,000-sample batch validates in
# about 1 ms this way; Python validators per record tripled that).
Ts = Annotated[float, Field(allow_inf_nan=False, description="Unix seconds, UTC")]


class Record(BaseModel):
    """Strict types; unknown fields kept (newer agents add optional ones) when storable."""

    model_config = ConfigDict(
        strict=True,
        extra="allow",
        json_schema_extra={"propertyNames": {"pattern": EXTRA_KEY_PATTERN}},
    )
    # Every value of the body is validated, unknown ones included: the worker parses the
    # raw body again, and a NaN token or a NUL that was skipped here would fail there.
    __pydantic_extra__: dict[ExtraKey, RecordExtra] = Field(init=False)


class Sample(Record):
    ts: Ts
    metric: Metric
    gpu: Gpu | None = None
    value: Real


class Canary(Record):
    norm: Real
    proj: list[Real] = Field(default_factory=list, max_length=64)


class Step(Record):
    ts: Ts
    rank: Rank
    step: StepNumber
    step_time: Seconds
    data_time: Seconds | None = None
    h2d_time: Seconds | None = None
    compute_time: Seconds | None = None
    comm_wait: Seconds | None = None
    tokens: Tokens | None = None
    loss: Real | None = None
    grad_checksum: Checksum | None = None
    param_checksum: Checksum | None = None
    canary: Canary | None = None
    shard: Shard | None = Field(
        default=None,
        description=(
            "The model shard the rank holds: only ranks reporting the same shard are compared"
            " (checksums bit for bit, canaries within tolerance); without it, all ranks of the"
            " run are. Free text of at most 128 characters. opsboard_agent's reporter derives"
            " it from a sharded model unless given one: '<where>-<12 hex>', e.g."
            " 'fsdp2-shard=1of2-3fa9c0d1e2b4', where <where> is the rank's coordinate on each"
            " sharded mesh dimension (FSDP2, HSDP, tensor parallel), its rank in the FSDP1"
            " sharding group or its pipeline stage, and the hex a BLAKE2b hash of every"
            " parameter's name, dtype, global shape and placement. Data-parallel replicas of"
            " a shard share it; an unsharded (DDP) model sends none. A shard may name its"
            " canary's group after ';canary=' (FSDP, whose canary probes the unsharded"
            " model: e.g. 'fsdp2-shard=1of4-3fa9c0d1e2b4;canary=all-0b1c2d3e4f5a'): canaries"
            " are then compared within that group, checksums still within the whole shard."
        ),
    )
    # the rank's GPU index on its node (an extension: ties the rank to that GPU's tile)
    gpu: Gpu | None = None


class Event(Record):
    ts: Ts
    # run_end (an extension of the contract, docs/api.md): the run ended, `state` finished
    # or failed, `message` optional; sent by the reporter's close() and at exit.
    kind: Literal["checkpoint", "restart", "oom", "xid", "ecc", "error", "log", "run_end"]
    step: StepNumber | None = None
    tier: Literal["local", "durable"] | None = None
    state: Literal["started", "completed", "failed", "finished"] | None = None
    path: Path | None = None
    bytes: Bytes | None = None
    duration: Seconds | None = None
    rank: Rank | None = None
    gpu: Gpu | None = None
    code: Code | None = None
    count: Count | None = None
    message: Message | None = None
    level: Level | None = None

    @model_validator(mode="after")
    def fields_of_kind(self) -> Event:
        problem = event_problem(self, getattr)
        if problem:
            raise ValueError(problem)
        return self


class NodeInfo(BaseModel):
    """The node's description, stored as sent and drawn on its page: known fields bounded,
    extra ones only as bounded scalars under plain keys, at most 32 of them."""

    model_config = ConfigDict(
        strict=True,
        extra="allow",
        json_schema_extra={
            "propertyNames": {"pattern": EXTRA_KEY_PATTERN},
            "maxProperties": 4 + NODE_INFO_MAX_EXTRAS,  # the known four and the extras
        },
    )
    __pydantic_extra__: dict[ExtraKey, NodeInfoExtra] = Field(init=False)

    gpus: GpuCount | None = None
    gpu_model: GpuModel | None = None
    cpus: CpuCount | None = None
    mem_bytes: MemBytes | None = None

    @model_validator(mode="after")
    def few_extras(self) -> NodeInfo:
        if len(self.__pydantic_extra__ or ()) > NODE_INFO_MAX_EXTRAS:
            raise ValueError(f"at most {NODE_INFO_MAX_EXTRAS} extra fields")
        return self


# The record limit is checked in Rust as each list's length and after validation as their
# sum: a "before" validator that counted them made pydantic build the whole body as Python
# objects first, which doubled the cost of every batch.
Records = Field(default_factory=list, max_length=settings.INGEST_MAX_RECORDS)


class IngestBatch(Record):
    batch_id: BatchId
    node: Name
    node_info: NodeInfo | None = None
    samples: list[Sample] = Records
    steps: list[Step] = Records
    events: list[Event] = Records
    # declared after `steps` so that its validator can see them
    run: Name | None = Field(default=None, validate_default=True)

    @classmethod
    def model_validate_json(cls, json_data: str | bytes, **kwargs: Any) -> IngestBatch:
        """Pydantic's, with the contract's wording for broken bounds: raises BatchRejected
        (400, one {loc, msg} per bad field) instead of pydantic's ValidationError."""
        try:
            return super().model_validate_json(json_data, **kwargs)
        except ValidationError as exc:
            raw = exc.errors(include_url=False)
            too_long = [e for e in raw if e["type"] == "too_long" and len(e["loc"]) == 1]
            if too_long:
                count = max(error["ctx"]["actual_length"] or 0 for error in too_long)
                raise TooManyRecords(
                    f"{count} records, at most {settings.INGEST_MAX_RECORDS}"
                ) from exc
            errors = validation_errors(raw)
            for item, error in zip(errors, raw, strict=True):
                item["msg"] = bound_message(error) or item["msg"]
            raise BatchRejected(errors) from exc

    @model_validator(mode="after")
    def record_limit(self) -> IngestBatch:
        if problem := record_count_problem(self.samples, self.steps, self.events):
            raise TooManyRecords(problem)
        return self

    @model_validator(mode="after")
    def ts_in_window(self) -> IngestBatch:
        errors = ts_window_errors(self.samples, self.steps, self.events, getattr)
        if errors:
            raise BatchRejected(errors)
        return self

    @field_validator("run")
    @classmethod
    def run_with_steps(cls, run: str | None, info: ValidationInfo) -> str | None:
        problem = run_problem(run, info.data.get("steps"), info.data.get("events"), getattr)
        if problem:
            raise ValueError(problem)
        return run


# The rules across fields and records, over models (field = getattr) or over the plain dicts
# of the fast check in apps.ingest.validation (field = dict.get): written once for both.
Field_ = Callable[[Any, str], Any]

EVENT_NEEDS = {
    "checkpoint": ("step", "tier", "state"),
    "xid": ("gpu", "code"),
    "ecc": ("gpu", "count"),
    "run_end": ("state",),
}


def event_problem(event: Any, field: Field_) -> str | None:
    kind, state = field(event, "kind"), field(event, "state")
    missing = [name for name in EVENT_NEEDS.get(kind, ()) if field(event, name) is None]
    if missing:
        return f"a {kind} event needs {', '.join(missing)}"
    if kind == "run_end" and state not in ("finished", "failed"):
        return "a run_end event's state is finished or failed"
    if kind == "checkpoint" and state == "finished":
        return "a checkpoint event's state is started, completed or failed"
    return None


def record_count_problem(samples: Sequence, steps: Sequence, events: Sequence) -> str | None:
    count = len(samples) + len(steps) + len(events)
    if count > settings.INGEST_MAX_RECORDS:
        return f"{count} records, at most {settings.INGEST_MAX_RECORDS}"
    return None


def ts_window_errors(
    samples: Sequence, steps: Sequence, events: Sequence, field: Field_
) -> list[dict[str, str]]:
    """Every `ts` within [now − 7 days, now + 5 minutes]; one pass over the records."""
    now = time.time()
    low, high = now - PAST_LIMIT_S, now + FUTURE_LIMIT_S
    errors = []
    for name, records in (("samples", samples), ("steps", steps), ("events", events)):
        for index, record in enumerate(records):
            ts = field(record, "ts")
            if not low <= ts <= high:
                late = "more than 5 minutes in the future"
                errors.append(
                    {
                        "loc": f"{name}[{index}].ts",
                        "msg": late if ts > high else "more than 7 days in the past",
                    }
                )
    return errors


def run_problem(run: str | None, steps: Any, events: Any, field: Field_) -> str | None:
    if not run and steps:
        return "required when steps is not empty"
    if not run and any(field(e, "kind") == "run_end" for e in events or ()):
        return "required with a run_end event"
    return None


def batch_problems(
    *, samples: Sequence, steps: Sequence, events: Sequence, run: str | None, field: Field_
) -> bool:
    """True when a batch whose records each passed breaks a rule across them."""
    return bool(
        record_count_problem(samples, steps, events)
        or run_problem(run, steps, events, field)
        or any(event_problem(event, field) for event in events)
        or ts_window_errors(samples, steps, events, field)
    )


class Accepted(BaseModel):
    samples: int
    steps: int
    events: int


class IngestAccepted(BaseModel):
    batch_id: str
    accepted: Accepted


class IngestDuplicate(BaseModel):
    batch_id: str
    duplicate: Literal[True]


class RemoteWriteRefusal(BaseModel):
    series: str = Field(description='the series as Prometheus names it: name{label="value",...}')
    reason: str


class RemoteWriteRefused(BaseModel):
    series: int
    samples: int
    examples: list[RemoteWriteRefusal] = Field(description="the first 20 refused series")


class RemoteWriteCounts(BaseModel):
    samples: int
    events: int


class RemoteWriteAnswer(BaseModel):
    """What became of a remote-write request's samples (docs/contract.md)."""

    accepted: RemoteWriteCounts
    batches: int = Field(description="ingest batches committed to the inbox")
    replayed: int = Field(description="samples at or before their series' last: accepted before")
    dropped: int = Field(description="staleness markers, NaN, DCGM blanks, unkept buckets")
    refused: RemoteWriteRefused
