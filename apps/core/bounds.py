"""The storage bounds of ingest: the one place that says which values the server can store.

A batch that validates must be storable by the worker, whatever its values: a value that
passes here but that Postgres (or the rollups that sum it, or the pages that draw it)
cannot take would be a poison batch. Every bound below names the storage it protects; the
reasons are written up in docs/security.md ("Input bounds").

The per-record types are checked by pydantic-core in Rust (no Python call per record: the
ingest hot path validates a 1,000-sample batch in about a millisecond). Python runs only
for `node_info` (one per batch) and for unknown fields, which agents rarely send.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StringConstraints, WithJsonSchema

# Column ranges (Postgres integer / bigint).
INT4_MAX = 2**31 - 1
INT8_MAX = 2**63 - 1

# `rank` goes to an int4 column and `world_size` (= highest rank + 1) to another.
RANK_MAX = INT4_MAX - 1
# Step counters and byte counts: bigint columns, never summed.
STEP_MAX = INT8_MAX
BYTES_MAX = INT8_MAX
# Tokens are summed per rollup bucket into a bigint (history_*.tokens_sum): at 2**40 per
# report (about 65,000 times a 16 M-token global batch, per rank), 2**23 reports in one
# bucket still fit.
TOKENS_MAX = 2**40
# Event `code` (an XID) and `count` (ECC errors): stored in the event, kept within int4.
CODE_MIN, CODE_MAX = -(2**31), INT4_MAX
COUNT_MAX = INT4_MAX

# GPUs per node. The sample store keys series by a smallint GPU, and the pages draw one tile
# per GPU: a bound far above any real node (8 or 16 GPUs) keeps both small.
MAX_GPUS = 64
GPU_MAX = MAX_GPUS - 1
CPUS_MAX = 2**16
# Bytes of host memory: 2**53 (8 PiB) stays exact in JSON numbers read by the browser.
MEM_BYTES_MAX = 2**53
# Integers of unknown fields (kept as JSON): the same bound, exact everywhere they are read.
JSON_INT_MAX = 2**53

# Floats are stored as float8 and summed by the chunk writer and the rollups: with
# |x| <= 1e150 even a square stays below 1e300, so a sum of up to 1e8 values, or of their
# squares (should a deviation ever be rolled up), stays below 1.8e308, the float8 maximum.
FLOAT_ABS_MAX = 1e150
# Durations in seconds (step_time and its parts, checkpoint duration): 1e7 s is 115 days.
SECONDS_MAX = 1e7

# String lengths (the column's max_length where there is one).
NAME_MAX_LENGTH = 255  # clusters_node.name, runs_run.name
BATCH_ID_MAX_LENGTH = 128  # ingest_inboxbatch.batch_id
METRIC_MAX_LENGTH = 128  # telemetry_metric.name
SHARD_MAX_LENGTH = 128  # runs_stepreport.shard
CHECKSUM_MAX_LENGTH = 64  # runs_stepreport.{grad,param}_checksum
PATH_MAX_LENGTH = 4096
MESSAGE_MAX_LENGTH = 8192
LEVEL_MAX_LENGTH = 16
GPU_MODEL_MAX_LENGTH = 256
EXTRA_STR_MAX_LENGTH = 1024  # a string in node_info's extra fields
EXTRA_KEY_MAX_LENGTH = 64
NODE_INFO_MAX_EXTRAS = 32

# Postgres text and jsonb refuse NUL (U+0000); every stored string is checked for it.
NO_NUL_PATTERN = r"^[^\x00]*$"
METRIC_PATTERN = r"^[A-Za-z_:][A-Za-z0-9_:.]*$"
CHECKSUM_PATTERN = r"^[0-9a-fA-F]+$"
# Node and run names become URL path segments (/clusters/c/nodes/<name>/): no control
# characters, whitespace, '/', '\', '?', '#' or '%', and not '.' or '..' (which a browser
# resolves away). Spelled without lookarounds so pydantic-core's Rust engine takes it.
_NAME_EXCLUDED = r"\x00-\x20\x7f-\x9f\s/\\?#%"
_NAME_CHAR, _NAME_NOT_DOT = rf"[^{_NAME_EXCLUDED}]", rf"[^{_NAME_EXCLUDED}.]"
NAME_PATTERN = rf"^(?:{_NAME_NOT_DOT}|\.{_NAME_NOT_DOT}|\.\.{_NAME_CHAR}){_NAME_CHAR}*$"
# Keys of unknown fields: stored as JSON object keys, shown on pages.
EXTRA_KEY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.\-]*$"


def text(max_length: int, *, min_length: int = 0) -> Any:
    """A string Postgres can store: no NUL, at most `max_length` characters."""
    return Annotated[
        str,
        StringConstraints(min_length=min_length, max_length=max_length, pattern=NO_NUL_PATTERN),
    ]


def integer(low: int, high: int) -> Any:
    return Annotated[int, Field(ge=low, le=high)]


def real(low: float = -FLOAT_ABS_MAX, high: float = FLOAT_ABS_MAX) -> Any:
    """A finite float within [low, high] (by default the summable range)."""
    return Annotated[float, Field(ge=low, le=high, allow_inf_nan=False)]


Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=NAME_MAX_LENGTH, pattern=NAME_PATTERN),
    Field(description="a node or run name: usable as a URL path segment"),
]
Metric = Annotated[str, StringConstraints(max_length=METRIC_MAX_LENGTH, pattern=METRIC_PATTERN)]
Checksum = Annotated[
    str, StringConstraints(max_length=CHECKSUM_MAX_LENGTH, pattern=CHECKSUM_PATTERN)
]
Real = real()
Seconds = real(0, SECONDS_MAX)
Gpu = integer(0, GPU_MAX)
Rank = integer(0, RANK_MAX)
StepNumber = integer(0, STEP_MAX)
Tokens = integer(0, TOKENS_MAX)
Bytes = integer(0, BYTES_MAX)
Code = integer(CODE_MIN, CODE_MAX)
Count = integer(0, COUNT_MAX)
GpuCount = integer(0, MAX_GPUS)
CpuCount = integer(0, CPUS_MAX)
MemBytes = integer(0, MEM_BYTES_MAX)
BatchId = text(BATCH_ID_MAX_LENGTH, min_length=1)
Shard = text(SHARD_MAX_LENGTH)
Path = text(PATH_MAX_LENGTH)
Message = text(MESSAGE_MAX_LENGTH)
Level = text(LEVEL_MAX_LENGTH)
GpuModel = text(GPU_MODEL_MAX_LENGTH)
ExtraKey = Annotated[
    str,
    StringConstraints(min_length=1, max_length=EXTRA_KEY_MAX_LENGTH, pattern=EXTRA_KEY_PATTERN),
]


def storable_json(value: Any, *, depth: int = 0) -> str | None:
    """Why `value` (parsed JSON) cannot be stored as jsonb and read back, or None if it can."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if abs(value) <= JSON_INT_MAX else f"integer beyond ±2**53: {value}"
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) > FLOAT_ABS_MAX:
            return f"must be a finite number within ±{FLOAT_ABS_MAX:g}"
        return None
    if isinstance(value, str):
        if "\x00" in value:
            return "must not contain NUL (\\u0000)"
        return None if len(value) <= MESSAGE_MAX_LENGTH else "string too long"
    if depth >= 8:
        return "nested too deeply (at most 8 levels)"
    if isinstance(value, list):
        items = value
    elif isinstance(value, dict):
        if any("\x00" in key for key in value):
            return "a key must not contain NUL (\\u0000)"
        items = list(value.values())
    else:  # not produced by a JSON parser
        return f"not a JSON value: {type(value).__name__}"
    for item in items:
        problem = storable_json(item, depth=depth + 1)
        if problem:
            return problem
    return None


def _check_storable(value: Any) -> Any:
    problem = storable_json(value)
    if problem:
        raise ValueError(problem)
    return value


def _check_scalar(value: Any) -> Any:
    if isinstance(value, str) and len(value) > EXTRA_STR_MAX_LENGTH:
        raise ValueError(f"at most {EXTRA_STR_MAX_LENGTH} characters")
    if isinstance(value, (list, dict)):
        raise ValueError("must be a string, number, boolean or null")
    return _check_storable(value)


# An unknown field of a record (kept as sent, for newer agents): any JSON value that jsonb
# stores and the worker's parser reads back (no NaN/Infinity tokens, no NUL, bounded).
RecordExtra = Annotated[
    Any,
    AfterValidator(_check_storable),
    WithJsonSchema(
        {
            "description": "any JSON value without NUL, NaN or Infinity; integers within"
            " ±2**53, numbers within ±1e150, strings up to 8192 characters, 8 levels deep"
        }
    ),
]
# An extra field of node_info: a scalar, shown on the node page.
NodeInfoExtra = Annotated[
    Any,
    AfterValidator(_check_scalar),
    WithJsonSchema(
        {
            "type": ["string", "number", "integer", "boolean", "null"],
            "description": "a string without NUL up to 1024 characters, a boolean, an"
            " integer within ±2**53 or a finite number within ±1e150",
        }
    ),
]


_PATTERN_MESSAGES = {
    NO_NUL_PATTERN: "must not contain NUL (\\u0000)",
    NAME_PATTERN: "must work as a URL path segment: no control characters, whitespace,"
    " '/', '\\', '?', '#' or '%', and not '.' or '..'",
    METRIC_PATTERN: "must match [A-Za-z_:][A-Za-z0-9_:.]*",
    CHECKSUM_PATTERN: "must be hexadecimal",
    EXTRA_KEY_PATTERN: "an unknown field's name must match [A-Za-z_][A-Za-z0-9_.-]*",
}


def bound_message(error: dict[str, Any]) -> str | None:
    """The wording of a bound that a pydantic error item broke, or None for pydantic's own
    (its pattern messages quote the regex; its limits print 1e150 with 150 zeros)."""
    ctx = error.get("ctx") or {}
    kind = error.get("type")
    if kind == "string_pattern_mismatch":
        return _PATTERN_MESSAGES.get(ctx.get("pattern"))
    if kind in ("float_type", "finite_number"):  # strict: "NaN" as a string is no number
        return "must be a finite number"
    if kind == "less_than_equal":
        return f"must be at most {_number(ctx['le'])}"
    if kind == "greater_than_equal":
        return f"must be at least {_number(ctx['ge'])}"
    return None


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
