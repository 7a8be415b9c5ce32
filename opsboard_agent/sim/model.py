"""The pure cluster model: seed + layout + faults + simulated time → samples, steps, events.

No I/O and no clock: times are simulated seconds from the start (t = 0). Every random value
is keyed noise (`noise`), so the output is a function of the inputs alone: `advance(600)`
gives the same records as `advance(1)`, `advance(2)`, … `advance(600)`.

Training is synchronous data parallel. In step k every rank loads data, stages it to the
GPU and computes; the all-reduce cannot finish before the slowest rank is ready, so

    step_time = max over ranks(data + h2d + compute) + comm     (the same for every rank)
    comm_wait(rank) = step_time - (data + h2d + compute)(rank)

A slow rank therefore shows a long compute and the *shortest* comm_wait; its peers wait.

With `SimConfig.noise` on, each phase of each rank's step gets a lognormal factor, a rare
step gets a 2-5x compute spike on one rank, and telemetry jitters (`noise.Noise`).

Faults change the data as `faults` documents; the run-level consequences are modelled too:
a run stops stepping at the earliest of its `hang`, the loss of one of its nodes (the other
ranks block in a collective: telemetry goes on) and an OOM (the job crashes: its GPUs go
idle). A lost node sends nothing from then on. A `resume` crashes the job (the step in
flight never ends, its GPUs idle for `down` seconds) and starts it again from its newest
completed local checkpoint: its step counter goes back (`Resume`).

Events are scheduled in `events`, a step's checksums and loss come from `checks`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opsboard_agent.sim.checks import step_checks, step_loss
from opsboard_agent.sim.events import EventSchedule, SimEvent
from opsboard_agent.sim.faults import Fault
from opsboard_agent.sim.layout import Layout, RankSlot
from opsboard_agent.sim.noise import Noise, jitter, lognormal
from opsboard_agent.sim.telemetry import SimSample, node_samples

__all__ = ["ClusterModel", "Resume", "SimConfig", "SimEvent", "SimSample", "SimStep", "Tick"]

# The nominal split of a step, as fractions of --step-time (compute-bound, ~4 % stalls).
DATA_SHARE, H2D_SHARE, COMPUTE_SHARE, COMM_SHARE = 0.03, 0.01, 0.80, 0.14
MAX_SM_CLOCK_MHZ = 1980.0
THROTTLE_TEMP_C = 85.0
NORMAL_TEMP_C = 63.0  # a busy, well-cooled GPU


@dataclass(frozen=True)
class SimConfig:
    seed: int = 0
    step_time: float = 1.0
    interval: float = 10.0
    check_every: int = 10
    checkpoint_every: int = 100
    tokens_per_step: int = 32768  # per rank: 8 sequences of 4096 tokens
    # Off by default here (the model's own tests pin exact shapes); the CLI turns it on.
    noise: Noise = Noise()

    def __post_init__(self) -> None:
        if not (self.step_time > 0 and self.interval > 0):
            raise ValueError("step_time and interval must be > 0")
        if self.check_every < 1 or self.checkpoint_every < 1:
            raise ValueError("check_every and checkpoint_every must be >= 1")


@dataclass(frozen=True)
class SimStep:
    """One rank's report of one step; `fields` are the contract's step fields but `ts`."""

    t: float
    run: str
    node: str
    rank: int
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class Resume:
    """A `resume` fault as it plays out: the job crashes at `at` during `crash_step` (in
    flight, never finished) and starts again at `restart_t` from the checkpoint at
    `checkpoint_step` (None: none was saved, it starts over), so its next step is
    `resume_step`. The old timeline's steps from `resume_step` on, which ended between
    `lost_from` and `lost_to`, were thrown away."""

    run: str
    at: float
    restart_t: float
    crash_step: int
    checkpoint_step: int | None
    resume_step: int
    lost_from: float
    lost_to: float
    event: bool  # a `restart` event is sent, as `opsboard-agent supervise` does


@dataclass
class Tick:
    samples: list[SimSample] = field(default_factory=list)
    steps: list[SimStep] = field(default_factory=list)
    events: list[SimEvent] = field(default_factory=list)


@dataclass
class _Cursor:
    step: int = 0
    t: float = 0.0
    stopped: bool = False


class ClusterModel(EventSchedule):
    """Generates the cluster's records in simulated-time order; see the module docstring."""

    def __init__(self, layout: Layout, faults: Sequence[Fault], config: SimConfig) -> None:
        self.layout, self.faults, self.config = layout, tuple(faults), config
        self.seed = config.seed
        self._cursors = {run.name: _Cursor() for run in layout.runs}
        self._next_sample = 0
        self._until = -math.inf
        self._events: list[tuple[tuple[Any, ...], SimEvent]] = []
        self._seq = 0
        self._writing: dict[str, list[tuple[float, float]]] = {r.name: [] for r in layout.runs}
        self.lost_at = {node: math.inf for node in layout.nodes}
        for fault in self.of_kind("node-loss"):
            node = str(fault.node)
            self.lost_at[node] = min(self.lost_at[node], fault.at)
        self.halt = {run.name: self._halt(run.name) for run in layout.runs}
        for fault in self.of_kind("oom-creep"):
            # Only the OOM that stops its run happens (a run dies once).
            if self.halt[str(fault.run)] == (fault.at + fault.param("ramp"), "oom"):
                self._schedule_oom(fault)
        for fault in self.of_kind("xid"):
            self._schedule(self._xid_event(fault), (fault.gpu, fault.param("code")))
        self.resumes = {run.name: self._resumes(run.name) for run in layout.runs}
        for resumes in self.resumes.values():
            for count, resume in enumerate(resumes, start=1):
                if resume.event:
                    self._schedule_restart(resume.run, resume.restart_t, count)

    # -- fault lookups (pure) ------------------------------------------------------------

    def of_kind(self, kind: str) -> list[Fault]:
        return [fault for fault in self.faults if fault.kind == kind]

    def active(self, kind: str, t: float, **subject: object) -> list[Fault]:
        """Faults of `kind` started by `t` whose subject matches `subject`."""
        return [
            fault
            for fault in self.faults
            if fault.kind == kind
            and fault.at <= t
            and all(getattr(fault, key) == value for key, value in subject.items())
        ]

    def _halt(self, run: str) -> tuple[float, str]:
        """When and why `run` stops stepping (inf, "" if it never does)."""
        candidates = [(math.inf, "")]
        candidates += [(f.at, "hang") for f in self.of_kind("hang") if f.run == run]
        nodes = self.layout.run(run).nodes
        candidates += [(self.lost_at[n], "node-loss") for n in nodes if self.lost_at[n] < math.inf]
        candidates += [
            (f.at + f.param("ramp"), "oom") for f in self.of_kind("oom-creep") if f.run == run
        ]
        return min(candidates)

    def _resumes(self, run: str) -> list[Resume]:
        """How the run's `resume` faults play out (in time order): the run is stepped
        ahead, as `_steps` will, to find the step each crash hits and the checkpoint it
        resumes from."""
        faults = sorted((f for f in self.of_kind("resume") if f.run == run), key=lambda f: f.at)
        out: list[Resume] = []
        step, t = 0, 0.0
        saved: list[tuple[float, int, float]] = []  # (completed at, step, the step's end)
        ends: dict[int, float] = {}
        for fault in faults:
            if fault.at < t:
                continue  # it struck while the job was down: the same crash
            while (end := self._step(run, step, t, with_reports=False)[1]) <= fault.at:
                ends[step] = end
                if step > 0 and step % self.config.checkpoint_every == 0:
                    saved.append((end + self.local_save_s(run, step), step, end))
                step, t = step + 1, end
            done = [(s, e) for completed, s, e in saved if completed <= fault.at]
            checkpoint, since = max(done) if done else (None, 0.0)
            resume_step = 0 if checkpoint is None else checkpoint + 1
            restart_t = fault.at + fault.param("down")
            out.append(
                Resume(
                    run,
                    fault.at,
                    restart_t,
                    step,
                    checkpoint,
                    resume_step,
                    since,
                    ends.get(step - 1, since),
                    bool(fault.param("event")),
                )
            )
            saved = [item for item in saved if item[1] < resume_step]
            step, t = resume_step, restart_t
        return out

    def run_state(self, run: str, t: float) -> str:
        """`training`, `hung` (blocked, GPUs spin in NCCL kernels) or `crashed` (idle)."""
        halt_t, reason = self.halt[run]
        if any(r.at <= t < r.restart_t for r in self.resumes.get(run, ())):
            return "crashed"  # down between a crash and its resume
        if t < halt_t or (t == halt_t and reason == "oom"):
            return "training"
        return "crashed" if reason == "oom" else "hung"

    def lost(self, node: str, t: float) -> bool:
        return t >= self.lost_at[node]

    def gpu_temp(self, node: str, gpu: int, t: float, base: float = NORMAL_TEMP_C) -> float:
        """Noise-free temperature: `base`, or the thermal fault's ramp from it."""
        for fault in self.active("thermal", t, node=node, gpu=gpu):
            share = min(1.0, (t - fault.at) / fault.param("ramp"))
            base += (fault.param("temp") - base) * share
        return base

    def sm_clock(self, node: str, gpu: int, t: float, temp: float | None = None) -> float:
        """The SM clock of a busy GPU: full speed, down 4 % per degree over 85 °C."""
        temp = self.gpu_temp(node, gpu, t) if temp is None else temp
        if temp <= THROTTLE_TEMP_C:
            return MAX_SM_CLOCK_MHZ
        return max(900.0, MAX_SM_CLOCK_MHZ * (1 - 0.04 * (temp - THROTTLE_TEMP_C)))

    def writing_checkpoint(self, run: str, t: float) -> bool:
        return any(start <= t < end for start, end in self._writing[run])

    # -- step timing (pure) --------------------------------------------------------------

    def phases(self, slot: RankSlot, t: float, step: int | None) -> tuple[float, float, float]:
        """(data, h2d, compute) of `slot` for a step starting at `t`; noise-free when
        `step` is None (the expectation, used for telemetry)."""
        s, key = self.config.step_time, (slot.run, slot.rank, step)
        noise = self.config.noise

        def wobble(name: str, amplitude: float) -> float:
            if step is None:
                return 1.0
            if noise.cv > 0:
                return lognormal(self.seed, noise.cv, name, *key)
            return 1.0 + amplitude * jitter(self.seed, name, *key)

        data = DATA_SHARE * s * wobble("data", 0.10)
        for fault in self.active("input-bound", t, node=slot.node):
            data = fault.param("factor") * s * wobble("data", 0.05)
        h2d = H2D_SHARE * s * wobble("h2d", 0.10)
        compute = COMPUTE_SHARE * s * wobble("compute", 0.01)
        for fault in self.active("straggler", t, run=slot.run, rank=slot.rank):
            compute *= fault.param("factor")
        if step is not None and noise.spike_rate > 0:
            world = self.layout.run(slot.run).world_size
            spike = noise.spike(self.seed, slot.run, step, world)
            if spike is not None and spike[0] == slot.rank:
                compute *= spike[1]
        compute *= MAX_SM_CLOCK_MHZ / self.sm_clock(slot.node, slot.gpu, t)
        return data, h2d, compute

    def comm(self, run: str, t: float, step: int | None) -> float:
        """The collective's own time (everyone ready → done); `fabric` stretches it."""
        comm = COMM_SHARE * self.config.step_time
        cv = self.config.noise.cv
        if step is not None and cv > 0:
            comm *= lognormal(self.seed, cv / 2, "comm", run, step)
        elif step is not None:
            comm *= 1.0 + 0.05 * jitter(self.seed, "comm", run, step)
        for fault in self.active("fabric", t, run=run):
            share = min(1.0, (t - fault.at) / fault.param("ramp"))
            comm *= 1.0 + (fault.param("factor") - 1.0) * share
        return comm

    def expected_split(
        self, run: str, t: float
    ) -> tuple[dict[int, tuple[float, float, float]], float]:
        """Noise-free (data, h2d, compute) per rank and the step time, at `t`."""
        split = {s.rank: self.phases(s, t, None) for s in self.layout.run(run).ranks}
        return split, max(map(sum, split.values())) + self.comm(run, t, None)

    # -- generation ----------------------------------------------------------------------

    def advance(self, until: float) -> Tick:
        """Everything with a time in (previous `until`, `until`], each list time-ordered."""
        if until < self._until:
            raise ValueError("the model only moves forward")
        self._until = until
        tick = Tick()
        for run in self.layout.runs:
            tick.steps.extend(self._steps(run.name, until))
        tick.steps.sort(key=lambda s: (s.t, s.run, s.rank))
        while self._events and self._events[0][0][0] <= until:
            _, event = heapq.heappop(self._events)
            if self._delivered(event):
                tick.events.append(event)
        interval = self.config.interval
        while (t := self._next_sample * interval) <= until:
            for node in self.layout.nodes:
                if not self.lost(node, t):
                    tick.samples.extend(node_samples(self, node, t))
            self._next_sample += 1
        return tick

    def _delivered(self, event: SimEvent) -> bool:
        """A lost node reports nothing; a crashed run's pending checkpoints never finish."""
        if self.lost(event.node, event.t):
            return False
        return not (
            event.run is not None
            and event.fields["kind"] == "checkpoint"
            and self.run_state(event.run, event.t) == "crashed"
        )

    def _steps(self, run: str, until: float) -> Iterable[SimStep]:
        cursor = self._cursors[run]
        halt_t = self.halt[run][0]
        while not cursor.stopped:
            reports, end = self._step(run, cursor.step, cursor.t)
            crash = next((r for r in self.resumes[run] if cursor.t <= r.at < end), None)
            if crash is not None:  # the step in flight never ends; the job starts again
                if crash.restart_t > until:
                    return
                cursor.step, cursor.t = crash.resume_step, crash.restart_t
                continue
            if end > halt_t:
                cursor.stopped = True  # the step in flight never ends
                return
            if end > until:
                return
            yield from reports
            if cursor.step > 0 and cursor.step % self.config.checkpoint_every == 0:
                self._schedule_checkpoint(run, cursor.step, end)
            cursor.step, cursor.t = cursor.step + 1, end

    def _step(
        self, run: str, step: int, start: float, with_reports: bool = True
    ) -> tuple[list[SimStep], float]:
        """Every rank's report of `step`, which starts at `start` (none without
        `with_reports`); and its end time."""
        slots = self.layout.run(run).ranks
        ready = {s.rank: self.phases(s, start, step) for s in slots}
        step_time = max(map(sum, ready.values())) + self.comm(run, start, step)
        end = start + step_time
        if not with_reports:
            return [], end
        checked = step % self.config.check_every == 0
        reports = []
        for slot in slots:
            data, h2d, compute = ready[slot.rank]
            # Each rank's own clock sees the step end a little apart.
            own = step_time + 0.0005 * self.config.step_time * jitter(
                self.seed, "own", run, slot.rank, step
            )
            fields: dict[str, Any] = {
                "rank": slot.rank,
                "step": step,
                "step_time": own,
                "data_time": data,
                "h2d_time": h2d,
                "compute_time": compute,
                "comm_wait": own - (data + h2d + compute),
                "tokens": self.config.tokens_per_step,
                "loss": step_loss(self.seed, run, slot.rank, step),
                "shard": slot.shard,
            }
            if checked:
                sdc = self.active("sdc", start, run=run, rank=slot.rank)
                fields.update(step_checks(self.seed, slot, step, sdc))
            reports.append(SimStep(end, run, slot.node, slot.rank, fields))
        return reports, end
