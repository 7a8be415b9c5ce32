"""The ingest batch of the contract (POST /api/v1/ingest), as pydantic models.

Validation here is complete: a batch that passes is stored by the worker without further
checks, so every rule of the contract that can make a batch invalid lives in this module.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from django.conf import settings
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

FUTURE_LIMIT_S = 5 * 60
PAST_LIMIT_S = 7 * 24 * 3600
METRIC_PATTERN = r"^[A-Za-z_:][A-Za-z0-9_:.]*$"


class TooManyRecords(Exception):
    """Raised from validation (not a ValueError, so pydantic lets it through) → 413."""


class BatchRejected(Exception):
    """Raised from validation with the contract's error items (loc, msg) → 400."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        super().__init__(f"{len(errors)} invalid fields")
        self.errors = errors


# Checked in Rust by pydantic: no Python call per field (a 1,000-sample batch validates in
# about 1 ms this way; Python validators per record tripled that).
Finite = Annotated[float, Field(allow_inf_nan=False)]
Ts = Annotated[float, Field(allow_inf_nan=False, description="Unix seconds, UTC")]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class Sample(BaseModel):
    ts: Ts
    metric: Annotated[str, StringConstraints(max_length=128, pattern=METRIC_PATTERN)]
    gpu: Annotated[int, Field(ge=0, le=32767)] | None = None
    value: Finite


class Canary(BaseModel):
    norm: Finite
    proj: list[Finite] = Field(default_factory=list, max_length=64)


Checksum = Annotated[str, StringConstraints(max_length=64, pattern=r"^[0-9a-fA-F]+$")]


class Step(BaseModel):
    ts: Ts
    rank: Annotated[int, Field(ge=0)]
    step: Annotated[int, Field(ge=0)]
    step_time: Seconds
    data_time: Seconds | None = None
    h2d_time: Seconds | None = None
    compute_time: Seconds | None = None
    comm_wait: Seconds | None = None
    tokens: Annotated[int, Field(ge=0)] | None = None
    loss: Finite | None = None
    grad_checksum: Checksum | None = None
    param_checksum: Checksum | None = None
    canary: Canary | None = None
    shard: Annotated[str, StringConstraints(max_length=128)] | None = None


class Event(BaseModel):
    ts: Ts
    kind: Literal["checkpoint", "restart", "oom", "xid", "ecc", "error", "log"]
    step: Annotated[int, Field(ge=0)] | None = None
    tier: Literal["local", "durable"] | None = None
    state: Literal["started", "completed", "failed"] | None = None
    path: Annotated[str, StringConstraints(max_length=4096)] | None = None
    bytes: Annotated[int, Field(ge=0)] | None = None
    duration: Seconds | None = None
    rank: Annotated[int, Field(ge=0)] | None = None
    gpu: Annotated[int, Field(ge=0)] | None = None
    code: int | None = None
    count: Annotated[int, Field(ge=0)] | None = None
    message: Annotated[str, StringConstraints(max_length=8192)] | None = None
    level: Annotated[str, StringConstraints(max_length=16)] | None = None

    @model_validator(mode="after")
    def fields_of_kind(self) -> Event:
        required = {
            "checkpoint": ("step", "tier", "state"),
            "xid": ("gpu", "code"),
            "ecc": ("gpu", "count"),
        }.get(self.kind, ())
        missing = [name for name in required if getattr(self, name) is None]
        if missing:
            raise ValueError(f"a {self.kind} event needs {', '.join(missing)}")
        return self


class NodeInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    gpus: Annotated[int, Field(ge=0)] | None = None
    gpu_model: Annotated[str, StringConstraints(max_length=256)] | None = None
    cpus: Annotated[int, Field(ge=0)] | None = None
    mem_bytes: Annotated[int, Field(ge=0)] | None = None


Name = Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=r"^[^\s/]+$")]


class IngestBatch(BaseModel):
    batch_id: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    node: Name
    node_info: NodeInfo | None = None
    samples: list[Sample] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)
    # declared after `steps` so that its validator can see them
    run: Name | None = Field(default=None, validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def record_limit(cls, data: Any) -> Any:
        if isinstance(data, dict):
            count = sum(
                len(data[key])
                for key in ("samples", "steps", "events")
                if isinstance(data.get(key), list)
            )
            if count > settings.INGEST_MAX_RECORDS:
                raise TooManyRecords(f"{count} records, at most {settings.INGEST_MAX_RECORDS}")
        return data

    @model_validator(mode="after")
    def ts_in_window(self) -> IngestBatch:
        """Every `ts` within [now − 7 days, now + 5 minutes]; one pass over the records."""
        now = time.time()
        low, high = now - PAST_LIMIT_S, now + FUTURE_LIMIT_S
        errors = []
        for name in ("samples", "steps", "events"):
            for index, record in enumerate(getattr(self, name)):
                if not low <= record.ts <= high:
                    errors.append(
                        {
                            "loc": f"{name}[{index}].ts",
                            "msg": "more than 5 minutes in the future"
                            if record.ts > high
                            else "more than 7 days in the past",
                        }
                    )
        if errors:
            raise BatchRejected(errors)
        return self

    @field_validator("run")
    @classmethod
    def run_with_steps(cls, run: str | None, info: ValidationInfo) -> str | None:
        if not run and info.data.get("steps"):
            raise ValueError("required when steps is not empty")
        return run


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


class ErrorItem(BaseModel):
    loc: str
    msg: str


class Errors(BaseModel):
    errors: list[ErrorItem]
