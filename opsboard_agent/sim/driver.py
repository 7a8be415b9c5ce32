"""Feeds the model's records to a server through the real agent code, paced to wall time.

- Node telemetry and node events (XIDs) take the node agent's path: a `SimCollector` hands
  the model's samples to `Agent.tick`, which goes on to `Shipper` → `Spool` → `Sender`,
  one of each per simulated node, exactly as `opsboard-agent run` wires them.
- Step reports and run events (checkpoints, OOMs) take the training reporter's path: one
  `Reporter` per rank (its `step()` and `event()`, its flusher thread, spool and sender).

Timestamps are simulated: simulated second `t` is sent as `base_ts + t`. The driver
advances the model to `elapsed_wall * speed` every `tick` wall seconds, so with `base_ts =
start - duration * (1 - 1/speed)` every timestamp is at or before the wall clock when it is
generated and the last one lands at about "now" (the contract takes ≤ 5 min ahead, ≤ 7 days
back).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from opsboard_agent.agent import Agent
from opsboard_agent.collectors import Collector
from opsboard_agent.records import Event, Sample, sample
from opsboard_agent.reporter import Reporter
from opsboard_agent.sender import Sender
from opsboard_agent.shipper import Shipper
from opsboard_agent.sim.model import ClusterModel, Tick
from opsboard_agent.sim.telemetry import node_info
from opsboard_agent.spool import Spool

log = logging.getLogger(__name__)

SPOOL_MAX_BYTES = 256 * 1024 * 1024


class SimCollector(Collector):
    """A node agent collector whose readings come from the model instead of NVML/psutil."""

    name = "sim"

    def __init__(self) -> None:
        self._samples: list[Sample] = []
        self._events: list[Event] = []

    def feed(self, samples: list[Sample], events: list[Event]) -> None:
        self._samples.extend(samples)
        self._events.extend(events)

    def collect(self, now: float) -> list[Sample]:
        samples, self._samples = self._samples, []
        return samples

    def take_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events


@dataclass
class _Node:
    collector: SimCollector
    agent: Agent
    shipper: Shipper


@dataclass
class DriveResult:
    samples: int = 0
    steps: int = 0
    events: int = 0
    rejected_batches: int = 0
    dropped_batches: int = 0
    undelivered_batches: int = 0

    @property
    def ok(self) -> bool:
        return not (self.rejected_batches or self.dropped_batches or self.undelivered_batches)


class Driver:
    """Builds the agents for `model`'s layout; `run()` plays `duration` simulated seconds."""

    def __init__(
        self,
        model: ClusterModel,
        *,
        server: str,
        token: str,
        base_ts: float,
        duration: float,
        speed: float,
        spool_dir: Path,
        tick: float = 0.25,
        flush_interval: float = 0.5,
    ) -> None:
        self.model, self.base_ts = model, base_ts
        self.duration, self.speed, self.tick = duration, speed, tick
        self.result = DriveResult()
        layout = model.layout
        self.nodes: dict[str, _Node] = {}
        for name in layout.nodes:
            spool = Spool(spool_dir / name / "agent", max_bytes=SPOOL_MAX_BYTES)
            sender = Sender(spool, server=server, token=token)
            shipper = Shipper(
                spool=spool, sender=sender, node=name, node_info=node_info(layout.gpus)
            ).start()
            collector = SimCollector()
            self.nodes[name] = _Node(collector, Agent([collector], shipper), shipper)
        self.reporters: dict[tuple[str, int], Reporter] = {}
        for run in layout.runs:
            for slot in run.ranks:
                self.reporters[(run.name, slot.rank)] = Reporter(
                    run=run.name,
                    server=server,
                    token=token,
                    node=slot.node,
                    rank=slot.rank,
                    local_rank=slot.gpu,
                    world_size=run.world_size,
                    check_every=model.config.check_every,
                    shard=slot.shard,
                    spool_dir=spool_dir / slot.node / f"rank-{slot.rank}",
                    flush_interval=flush_interval,
                )

    def run(self, stop: threading.Event | None = None) -> DriveResult:
        """Play the simulation (until `stop` is set, if earlier), then deliver what is
        spooled; `close()` must follow."""
        stop = stop or threading.Event()
        started = time.monotonic()
        while True:
            target = min(self.duration, (time.monotonic() - started) * self.speed)
            self.feed(self.model.advance(target), self.base_ts + target)
            if target >= self.duration or stop.is_set():
                return self.result
            stop.wait(self.tick)

    def feed(self, tick: Tick, now: float) -> None:
        """Hand one slice of the model's output to the agent code."""
        base = self.base_ts
        for step in tick.steps:
            fields = dict(step.fields)
            number = fields.pop("step")
            fields.pop("rank")
            fields.pop("shard", None)  # the reporter adds its own
            self.reporters[(step.run, step.rank)].step(number, ts=base + step.t, **fields)
        by_node: dict[str, tuple[list[Sample], list[Event]]] = defaultdict(lambda: ([], []))
        for event in tick.events:
            fields = dict(event.fields)
            if event.run is not None and event.rank is not None:
                kind = fields.pop("kind")
                self.reporters[(event.run, event.rank)].event(kind, ts=base + event.t, **fields)
            else:
                by_node[event.node][1].append({"ts": base + event.t, **fields})
        for item in tick.samples:
            record = sample(base + item.t, item.metric, item.value, item.gpu)
            if record is not None:
                by_node[item.node][0].append(record)
        self.result.samples += len(tick.samples)
        self.result.steps += len(tick.steps)
        self.result.events += len(tick.events)
        # Only a node with news ticks: a lost node's agent is gone and sends nothing.
        for name, (samples, events) in sorted(by_node.items()):
            node = self.nodes[name]
            node.collector.feed(samples, events)
            node.agent.tick(now=now)

    def close(self, drain_timeout: float = 30.0, *, end_runs: bool = False) -> DriveResult:
        """Spool everything and deliver for up to `drain_timeout` seconds in all. With
        `end_runs` every rank's reporter ends its run (`run_end` finished); without, the
        simulated jobs stop reporting as a killed or still-running job would."""
        deadline = time.monotonic() + drain_timeout
        shippers = [node.shipper for node in self.nodes.values()]
        shippers += [r.shipper for r in self.reporters.values() if r.shipper is not None]
        for shipper in shippers:
            shipper.flush()
        for node in self.nodes.values():
            node.shipper.close(drain_timeout=max(0.0, deadline - time.monotonic()))
        for reporter in self.reporters.values():
            reporter.close(
                drain_timeout=max(0.0, deadline - time.monotonic()),
                state="finished" if end_runs else None,
            )
        for shipper in shippers:
            self.result.undelivered_batches += len(shipper.spool)
            self.result.dropped_batches += shipper.spool.dropped
            if shipper.sender is not None:
                self.result.rejected_batches += shipper.sender.stats.rejected
        return self.result
