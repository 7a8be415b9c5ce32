"""Turning counters and last-value gauges into contract events (shared by the NVML and the
DCGM-scrape paths, so both report an XID or new ECC errors the same way)."""

from __future__ import annotations

from collections.abc import Hashable

from opsboard_agent.records import Event

# The server's bound on an event's count (apps/core/bounds.py, a Postgres integer): one beyond
# it would cost the whole batch.
COUNT_MAX = 2**31 - 1


class ErrorEvents:
    """Remembers the last ECC count and XID code per key (a GPU of one source).

    Policy, the same for both: the first observation of a non-zero value is reported. A
    restarted agent may report an old fatal XID again; missing one is worse."""

    def __init__(self) -> None:
        self._ecc: dict[Hashable, float] = {}
        self._xid: dict[Hashable, float] = {}

    def ecc(self, key: Hashable, ts: float, gpu: int, count: float, kind: str) -> Event | None:
        """An `ecc` event with the number of new errors since the last count, or None."""
        before = self._ecc.get(key)
        self._ecc[key] = count
        return ecc_event(ts, gpu, before, count, kind)

    def last_xid(self, key: Hashable, ts: float, gpu: int, code: float) -> Event | None:
        """An `xid` event when a "last XID" gauge changes to a non-zero code, or None."""
        before = self._xid.get(key)
        self._xid[key] = code
        return last_xid_event(ts, gpu, before, code)


def ecc_event(ts: float, gpu: int, before: float | None, count: float, kind: str) -> Event | None:
    """The `ecc` event of an ECC count going from `before` (None: not seen) to `count`: its
    new errors (all of it when first seen or after a reset), None when there are none."""
    new = count if before is None or count < before else count - before
    if new <= 0:
        return None
    return {"ts": ts, "kind": "ecc", "gpu": gpu, "count": min(int(new), COUNT_MAX), "type": kind}


def last_xid_event(ts: float, gpu: int, before: float | None, code: float) -> Event | None:
    """The `xid` event of a "last XID" gauge going from `before` to `code`, None unless it
    changed to a non-zero code."""
    if code == 0 or code == before:
        return None
    return xid_event(ts, gpu, int(code))


def xid_event(ts: float, gpu: int, code: int) -> Event:
    return {"ts": ts, "kind": "xid", "gpu": gpu, "code": code}
