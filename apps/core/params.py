"""Query parameters shared by the read APIs (telemetry, runs, alerts, audit)."""

from typing import Any

from pydantic import Field

# A timestamp Postgres's to_timestamp() and Python's datetime both take (1e10 is the year
# 2286). NaN and ±Infinity are refused: they would reach the database as timestamps.
TS_MAX = 1e10
CLUSTER_MAX_LENGTH = 64  # clusters_cluster.name


def timestamp_field(description: str = "Unix seconds") -> Any:
    """An optional query timestamp within [0, TS_MAX]."""
    return Field(default=None, ge=0, le=TS_MAX, allow_inf_nan=False, description=description)
