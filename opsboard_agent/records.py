"""The records of the wire contract (samples, step reports, events) as plain dicts, and the
checks that keep one bad value from costing a whole batch (a 400 stores nothing of it)."""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any, NotRequired, TypedDict

METRIC_MAX_LEN = 128
METRIC_RE = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:.]*$")
_INVALID_METRIC_CHARS = re.compile(r"[^A-Za-z0-9_:.]")
_INVALID_NAME_CHARS = re.compile(r"[\s/]")
GPU_MAX = 32767


class Sample(TypedDict):
    """A contract sample: `gpu` is the local GPU index, absent for host-wide metrics."""

    ts: float
    metric: str
    value: float
    gpu: NotRequired[int]


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


def sanitize_metric(name: str) -> str:
    """`name` made to match the contract's metric pattern and length.

    Invalid characters become `_`, a leading digit or dot gets a `_` prefix; a name over 128
    characters keeps its head and gets a short hash of the whole so distinct series stay
    distinct."""
    clean = _INVALID_METRIC_CHARS.sub("_", name) or "_"
    if not re.match(r"[A-Za-z_:]", clean[0]):
        clean = "_" + clean
    if len(clean) > METRIC_MAX_LEN:
        digest = hashlib.blake2b(name.encode(), digest_size=4).hexdigest()
        clean = f"{clean[: METRIC_MAX_LEN - 9]}.{digest}"
    return clean


def sanitize_name(name: str, fallback: str = "unknown") -> str:
    """A node or run name the contract accepts: no whitespace or '/', 1–255 chars."""
    clean = _INVALID_NAME_CHARS.sub("_", name.strip())[:255]
    return clean or fallback
