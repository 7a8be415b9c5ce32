"""The events a simulated cluster reports, scheduled ahead of time: checkpoint saves and
uploads, OOMs, Xids and the `restart` of a resumed job. A mixin of `ClusterModel`: the
schedule is a heap ordered by time, drained by `ClusterModel.advance`."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opsboard_agent.sim.faults import Fault
from opsboard_agent.sim.layout import Layout
from opsboard_agent.sim.noise import jitter

LOCAL_CKPT_S, DURABLE_CKPT_S = 4.0, 20.0
CKPT_BYTES_PER_RANK = 2_000_000_000


@dataclass(frozen=True)
class SimEvent:
    """A contract event (`fields` without `ts`); `rank` is the rank that reports a run
    event, None for a node event (reported by the node agent)."""

    t: float
    node: str
    run: str | None
    rank: int | None
    fields: Mapping[str, Any]


class EventSchedule:
    """Scheduling of the model's events (see the module docstring)."""

    layout: Layout
    seed: int
    _events: list[tuple[tuple[Any, ...], SimEvent]]
    _seq: int
    _writing: dict[str, list[tuple[float, float]]]

    active: Callable[..., Sequence[Fault]]  # the model's

    def local_save_s(self, run: str, step: int) -> float:
        """How long the blocking local save of `run`'s checkpoint at `step` takes."""
        return LOCAL_CKPT_S * (1 + 0.2 * jitter(self.seed, "ckpt-local", run, step))

    def _schedule(self, event: SimEvent, key: tuple[Any, ...]) -> None:
        order = (event.t, event.node, event.run or "", event.fields["kind"], *key)
        self._seq += 1  # only breaks ties between otherwise identical keys
        heapq.heappush(self._events, ((*order, self._seq), event))

    def _schedule_checkpoint(self, run: str, step: int, t: float) -> None:
        """Local save, then the upload to durable storage (which `nfs-drop` stalls)."""
        layout = self.layout.run(run)
        reporter = layout.ranks[0]
        size = CKPT_BYTES_PER_RANK * layout.world_size
        local = self.local_save_s(run, step)
        durable = DURABLE_CKPT_S * (1 + 0.2 * jitter(self.seed, "ckpt-durable", run, step))
        uploaded = t + local
        self._writing[run].append((t, uploaded))
        drops = self.active("nfs-drop", uploaded, run=run)
        phases: list[tuple[float, str, str, dict[str, Any]]] = [
            (t, "local", "started", {}),
            (uploaded, "local", "completed", {"bytes": size, "duration": local}),
            (uploaded, "durable", "started", {}),
        ]
        if drops:
            stall = drops[0].param("stall")
            phases.append((uploaded + stall, "durable", "failed", {"duration": stall}))
        else:
            phases.append(
                (uploaded + durable, "durable", "completed", {"bytes": size, "duration": durable})
            )
        for order, (when, tier, state, extra) in enumerate(phases):
            root = "/local/ckpt" if tier == "local" else "/nfs/ckpt"
            fields = {
                "kind": "checkpoint",
                "step": step,
                "tier": tier,
                "state": state,
                "path": f"{root}/{run}/step-{step}",
                "rank": reporter.rank,
                **extra,
            }
            self._schedule(SimEvent(when, reporter.node, run, reporter.rank, fields), (step, order))

    def _schedule_oom(self, fault: Fault) -> None:
        assert fault.run is not None and fault.node is not None and fault.rank is not None
        message = (
            f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU {fault.gpu} has a total "
            f"capacity of 80.00 GiB of which 0 bytes is free. (rank {fault.rank} on {fault.node})"
        )
        fields = {"kind": "oom", "rank": fault.rank, "message": message}
        when = fault.at + fault.param("ramp")
        self._schedule(SimEvent(when, fault.node, fault.run, fault.rank, fields), (fault.rank,))

    def _xid_event(self, fault: Fault) -> SimEvent:
        assert fault.node is not None
        code = int(fault.param("code"))
        message = f"NVRM: Xid (PCI:0000:{0x18 + 16 * (fault.gpu or 0):02x}:00): {code}"
        fields = {"kind": "xid", "gpu": fault.gpu, "code": code, "message": message}
        return SimEvent(fault.at, fault.node, None, None, fields)

    def _schedule_restart(self, run: str, t: float, count: int) -> None:
        """The `restart` event a supervisor (`opsboard-agent supervise`) sends when it
        starts the job again: from the run's first rank, as the reporter would."""
        reporter = self.layout.run(run).ranks[0]
        fields = {"kind": "restart", "rank": reporter.rank, "restart_count": count}
        self._schedule(SimEvent(t, reporter.node, run, reporter.rank, fields), (count,))
