"""The records of the wire contract (samples, step reports, events) as plain dicts, and the
checks that keep one bad value from costing a whole batch (a 400 stores nothing of it)."""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any, NamedTuple, NotRequired, TypedDict

METRIC_MAX_LEN = 128
METRIC_RE = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:.]*$")
_INVALID_METRIC_CHARS = re.compile(r"[^A-Za-z0-9_:.]")
_INVALID_NAME_CHARS = re.compile(r"[\s/]")
# The server's bound (apps/core/bounds.py): a sample beyond it would cost the whole batch.
GPU_MAX = 63


class Sample(TypedDict):
    """A contract sample: `gpu` is the local GPU index, absent for host-wide metrics."""

    ts: float
    metric: str
    value: float
    gpu: NotRequired[int]


class EncodedSamples(NamedTuple):
    """Samples already encoded: `count` JSON objects separated by commas. A scrape of
    thousands of series is encoded with a few C loops instead of a dict per sample."""

    text: str
    count: int  # type: ignore[assignment]  # shadows tuple.count(), never called here


# Step reports and events carry many optional fields; they stay plain dicts.
Step = dict[str, Any]
Event = dict[str, Any]


def sample(ts: float, metric: str, value: float, gpu: int | None = None) -> Sample | None:
    """A contract sample, or None when `value` is not a finite number (never sent)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(value):
        return None
    record: Sample = {"ts": ts, "metric": metric, "value": value}
    if gpu is not None:
        if not 0 <= gpu <= GPU_MAX:
            return None
        record["gpu"] = int(gpu)
    return record


def sanitize_metric(name: str, suffix: str = "") -> str:
    """`name` + `suffix` made to match the contract's metric pattern and length.

    Invalid characters become `_`, a leading digit or dot gets a `_` prefix; a name over 128
    characters keeps its head and gets a short hash of the whole so distinct series stay
    distinct. `suffix` (already valid, e.g. `.rate`) always survives at the end."""
    clean = _INVALID_METRIC_CHARS.sub("_", name) or "_"
    if not re.match(r"[A-Za-z_:]", clean[0]):
        clean = "_" + clean
    if len(clean) + len(suffix) > METRIC_MAX_LEN:
        digest = hashlib.blake2b(name.encode(), digest_size=4).hexdigest()
        clean = f"{clean[: METRIC_MAX_LEN - 9 - len(suffix)]}.{digest}"
    return clean + suffix


def sanitize_name(name: str, fallback: str = "unknown") -> str:
    """A node or run name the contract accepts: no whitespace or '/', 1–255 chars."""
    clean = _INVALID_NAME_CHARS.sub("_", name.strip())[:255]
    return clean or fallback
