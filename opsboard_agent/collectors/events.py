"""Turning counters and last-value gauges into contract events (shared by the NVML and the
DCGM-scrape paths, so both report an XID or new ECC errors the same way)."""

from __future__ import annotations

from collections.abc import Hashable

from opsboard_agent.records import Event


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
        new = count if before is None or count < before else count - before
        if new <= 0:
            return None
        return {"ts": ts, "kind": "ecc", "gpu": gpu, "count": int(new), "type": kind}

    def last_xid(self, key: Hashable, ts: float, gpu: int, code: float) -> Event | None:
        """An `xid` event when a "last XID" gauge changes to a non-zero code, or None."""
        before = self._xid.get(key)
        self._xid[key] = code
        if code == 0 or code == before:
            return None
        return xid_event(ts, gpu, int(code))


def xid_event(ts: float, gpu: int, code: int) -> Event:
    return {"ts": ts, "kind": "xid", "gpu": gpu, "code": code}
