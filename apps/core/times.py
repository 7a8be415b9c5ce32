"""Unix seconds (the protocol's timestamps) to and from aware datetimes (the columns')."""

from datetime import UTC, datetime


def to_datetime(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def to_seconds(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None
