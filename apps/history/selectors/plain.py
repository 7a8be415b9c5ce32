"""Selector results as plain dicts for JSON, without copying their data."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any


def plain(value: Any) -> Any:
    """A dataclass (nested ones too, in lists) as dicts that share its lists of numbers:
    dataclasses.asdict deep-copies every list item, which was half a node page's time."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, list) and value and is_dataclass(value[0]):
        return [plain(item) for item in value]
    return value
