"""The simulated scenarios of the evaluation: which faults, at which noise, and playing them.

Every scenario is one `opsboard-sim` run against the live stack, with a cluster of its own;
the seed moves the faulty rank / node / GPU and the start time, so a detector cannot be
right by always naming one rank. Each fault plays at every noise level (the simulator's
lognormal jitter CV, with rare 2-5x spikes on).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from apps.clusters.models import Cluster
from launcher.procs import ROOT, children_stop
from launcher.stack import DEMO_FAULTS

NODES, GPUS = 2, 8  # one run of 16 ranks
SIM_TIMEOUT_S = 900
NOISE_LEVELS = (0.1, 0.3)  # the simulator's per-step CV; spikes on at both
SENSITIVITY_FACTORS = (1.2, 1.5, 2.0)  # straggler slowdowns of the sensitivity table
STEP_S = 5.0  # replay period of a fault scenario (time to detect is quantised by it)
# The clean run's replay period. Its evaluations cost more the longer the run has gone on
# (the window reads more history), so the 2-hour run is judged every 15 s, not every 5 s:
# 480 evaluations per noise level instead of 1,440. An alert is state that persists, and
# every rule needs a window of >= 20 steps, so a false alarm lasting a window is still seen.
CLEAN_STEP_S = 15.0
EARLIER_SUFFIX = "-earlier"  # the scenario file of a restart's earlier session

# Per fault label: (the --fault spec for seed s, simulated seconds to play).
FAULTS: dict[str, tuple[Callable[[int], str], float]] = {
    "straggler": (lambda s: f"straggler:rank={(5 * s + 2) % 16},at={50 + 10 * s}", 300),
    "sdc/canary": (lambda s: f"sdc:rank={(3 * s + 1) % 16},mode=canary,at={50 + 10 * s}", 240),
    "sdc/param": (lambda s: f"sdc:rank={(7 * s + 4) % 16},mode=param,at={50 + 10 * s}", 240),
    "input-bound": (lambda s: f"input-bound:node={s % NODES},at={50 + 10 * s}", 300),
    "hang": (lambda s: f"hang:at={50 + 10 * s}", 360),
    "thermal": (lambda s: f"thermal:node={s % NODES},gpu={(3 * s + 1) % 8},at={50 + 10 * s}", 300),
    "xid": (
        lambda s: (
            f"xid:node={s % NODES},gpu={(5 * s) % 8},at={50 + 10 * s},code={(79, 48, 94)[s % 3]}"
        ),
        200,
    ),
    "node-loss": (lambda s: f"node-loss:node={s % NODES},at={50 + 10 * s}", 240),
    "nfs-drop": (lambda s: f"nfs-drop:at={10 * s},stall={40 + 10 * s}", 400),
    "fabric": (lambda s: f"fabric:at={50 + 10 * s},factor=3,ramp=30", 360),
    "oom-creep": (lambda s: f"oom-creep:rank={(11 * s + 3) % 16},at={50 + 10 * s},ramp=120", 300),
    # Crashes 35-70 steps past the step-100 checkpoint, down 30 s, then ~100 steps of the
    # new timeline: past the 120 s after the crash a hang would take, and the lost steps
    # still in the goodput's window (the run's last 120 steps). Odd seeds send supervise's
    # `restart` event, even ones leave the server to infer it from the steps going back.
    "resume": (lambda s: f"resume:at={150 + 10 * s},down=30,event={s % 2}", 330),
}

# Two independent faults at once, on different nodes: they must stay two incidents (issue
# 29). A GPU of node 0 throttles while a rank of node 1 computes wrong gradients; per label:
# (the --fault specs for seed s, simulated seconds to play).
TOGETHER: dict[str, tuple[Callable[[int], tuple[str, ...]], float]] = {
    "thermal + sdc": (
        lambda s: (
            f"thermal:node=0,gpu={(3 * s + 1) % 8},at={50 + 10 * s}",
            f"sdc:rank={8 + (3 * s + 2) % 8},mode=canary,at={60 + 10 * s}",
        ),
        300,
    ),
}
LABELS = [*FAULTS, *TOGETHER]  # what `make evaluate --fault` may name


def faults_of(label: str, seed: int) -> tuple[tuple[str, ...], float]:
    """The --fault specs of a fault label (or of a TOGETHER pair) for `seed`, and the
    simulated seconds to play."""
    if label in TOGETHER:
        specs, duration = TOGETHER[label]
        return specs(seed), duration
    spec, duration = FAULTS[label]
    return (spec(seed),), duration


# `make demo`'s cluster and simulator (launcher.stack.simulator_command): 8 nodes × 8 GPUs,
# two runs, seed 1, a sample a second, CV 10 % with spikes, DEMO_FAULTS, judged over its
# first ten minutes. Its first seconds once raised 9 oom_risk warnings on every start: the
# slope of a few noisy samples of flat memory (issue 29).
DEMO_SEED, DEMO_NODES, DEMO_RUNS, DEMO_INTERVAL_S, DEMO_S = 1, 8, 2, 1.0, 600.0
# The restart: a first session this long, stopped, and started again this much later.
DEMO_EARLIER_S, DEMO_RESTART_GAP_S = 100.0, 60.0


@dataclass(frozen=True)
class ScenarioSpec:
    name: str
    faults: tuple[str, ...]
    seed: int
    duration: float
    speed: float
    noise_cv: float = NOISE_LEVELS[0]
    spikes: bool = True
    step_s: float = STEP_S  # replay period
    label: str = ""  # the table row of its fault, when not the fault's own kind[/mode]
    group: str = "faults"  # which table: "faults", "sensitivity", "demo" or "ddp"
    # the cluster and its sampling (the fault scenarios': NODES × GPUS, one run, every 10 s)
    nodes: int = NODES
    runs: int = 1
    interval: float = 10.0
    prefix: str = "sim"
    # A restart: an earlier session of this many simulated seconds (same seed and faults) is
    # played first into the same cluster, ending at least `restart_gap_s` before this one.
    earlier_s: float = 0.0
    restart_gap_s: float = 0.0


def level_name(cv: float) -> str:
    return f"cv{round(cv * 100)}"


def scenario_specs(
    *,
    labels: list[str] | None = None,
    seeds: tuple[int, ...] = (1, 2, 3),
    levels: tuple[float, ...] = NOISE_LEVELS,
    spikes: bool = True,
    clean_s: float = 7200.0,
    speed: float = 20.0,
    clean_speed: float = 60.0,
    step_s: float = STEP_S,
    clean_step_s: float = CLEAN_STEP_S,
) -> list[ScenarioSpec]:
    """Every fault label and pair (or `labels`) × `seeds` × noise `levels` (spikes on
    unless `spikes` is False), plus one clean run of `clean_s` seconds per level (none
    when 0). A pair's faults are counted in a row of its own (its label)."""
    specs = [
        ScenarioSpec(
            f"{label.replace('/', '-').replace(' + ', '-and-')}-s{seed}-{level_name(cv)}",
            faults,
            seed,
            duration,
            speed,
            noise_cv=cv,
            spikes=spikes,
            step_s=step_s,
            label=label if label in TOGETHER else "",
        )
        for cv in levels
        for label in labels or LABELS
        for seed in seeds
        for faults, duration in [faults_of(label, seed)]
    ]
    if clean_s:
        specs += [
            ScenarioSpec(
                f"clean-{level_name(cv)}",
                (),
                42,
                clean_s,
                clean_speed,
                noise_cv=cv,
                spikes=spikes,
                step_s=clean_step_s,
            )
            for cv in levels
        ]
    return specs


def sensitivity_specs(
    *,
    seeds: tuple[int, ...] = (1, 2, 3),
    levels: tuple[float, ...] = NOISE_LEVELS,
    factors: tuple[float, ...] = SENSITIVITY_FACTORS,
    spikes: bool = True,
    speed: float = 20.0,
    step_s: float = STEP_S,
) -> list[ScenarioSpec]:
    """The straggler at each slowdown `factor` × noise level × seed."""
    spec, duration = FAULTS["straggler"]
    return [
        ScenarioSpec(
            f"sens-{factor:g}x-s{seed}-{level_name(cv)}",
            (f"{spec(seed)},factor={factor:g}",),
            seed,
            duration,
            speed,
            noise_cv=cv,
            spikes=spikes,
            step_s=step_s,
            label=f"{factor:g}x straggler",
            group="sensitivity",
        )
        for cv in levels
        for factor in factors
        for seed in seeds
    ]


def demo_specs(*, speed: float = 20.0, step_s: float = STEP_S) -> list[ScenarioSpec]:
    """`make demo`'s first ten minutes, fresh and restarted (a first session of
    DEMO_EARLIER_S, stopped and started again DEMO_RESTART_GAP_S later): scored like the
    fault scenarios, so any alert but those of DEMO_FAULTS is a false alarm."""

    def demo(name: str, earlier_s: float = 0.0, gap_s: float = 0.0) -> ScenarioSpec:
        return ScenarioSpec(
            name,
            DEMO_FAULTS,
            DEMO_SEED,
            DEMO_S,
            speed,
            step_s=step_s,
            group="demo",
            nodes=DEMO_NODES,
            runs=DEMO_RUNS,
            interval=DEMO_INTERVAL_S,
            prefix="demo",
            earlier_s=earlier_s,
            restart_gap_s=gap_s,
        )

    return [demo("demo-fresh"), demo("demo-restarted", DEMO_EARLIER_S, DEMO_RESTART_GAP_S)]


def sim_command(
    spec: ScenarioSpec, url: str, token_file: Path, out: Path, *, earlier: bool = False
) -> list[str]:
    """The simulator of `spec`, or (`earlier`) of its restart's earlier session: that one
    ends when this one's timeline begins (it ends about now), less the gap."""
    duration, ago = spec.duration, 0.0
    if earlier:
        duration = spec.earlier_s
        ago = spec.duration * (1.0 - 1.0 / spec.speed) + spec.restart_gap_s
    command = [
        sys.executable,
        "-m",
        "opsboard_agent.sim",
        *("--server", url, "--token-file", str(token_file)),
        *("--nodes", str(spec.nodes), "--gpus", str(GPUS), "--seed", str(spec.seed)),
        *("--runs", str(spec.runs), "--prefix", spec.prefix, "--interval", str(spec.interval)),
        *("--duration", str(duration), "--speed", str(spec.speed), "--ago", str(ago)),
        *("--noise-cv", str(spec.noise_cv), "--spikes" if spec.spikes else "--no-spikes"),
        *("--scenario-out", str(out), "--drain-timeout", "120"),
    ]
    for fault in spec.faults:
        command += ["--fault", fault]
    return command


def simulate(
    specs: list[ScenarioSpec],
    clusters: dict[str, tuple[Cluster, str]],
    url: str,
    workdir: Path,
    parallel: int,
    log: Callable[[str], None],
) -> None:
    """Run the simulators, `parallel` at a time; every one must deliver everything. A
    restart's two sessions play one after the other, the earlier first."""
    waiting = list(specs)
    running: dict[str, tuple[subprocess.Popen, float, ScenarioSpec, bool]] = {}
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                spec = waiting.pop(0)
                earlier = spec.earlier_s > 0
                process = _sim_start(spec, clusters, url, workdir, earlier=earlier)
                running[spec.name] = (process, time.monotonic(), spec, earlier)
            for name, (process, started, spec, earlier) in list(running.items()):
                try:
                    code = process.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    if time.monotonic() - started > SIM_TIMEOUT_S:
                        raise RuntimeError(f"simulator {name} ran past {SIM_TIMEOUT_S} s") from None
                    continue
                del running[name]
                if code != 0:
                    raise RuntimeError(f"simulator {name} exited {code}: see {workdir}/{name}.log")
                if earlier:  # now the session after the restart
                    process = _sim_start(spec, clusters, url, workdir)
                    running[name] = (process, time.monotonic(), spec, False)
                    continue
                log(f"simulated {name}")
    finally:
        children_stop(process for process, *_ in running.values())


def _sim_start(
    spec: ScenarioSpec,
    clusters: dict[str, tuple[Cluster, str]],
    url: str,
    workdir: Path,
    *,
    earlier: bool = False,
) -> subprocess.Popen:
    token_file = workdir / f"{spec.name}.token"
    token_file.write_text(clusters[spec.name][1])
    token_file.chmod(0o600)
    out = workdir / f"{spec.name}{EARLIER_SUFFIX if earlier else ''}.json"
    command = sim_command(spec, url, token_file, out, earlier=earlier)
    # the session after a restart appends to the earlier one's log
    mode = "ab" if spec.earlier_s > 0 and not earlier else "wb"
    with open(workdir / f"{spec.name}.log", mode) as output:
        return subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
