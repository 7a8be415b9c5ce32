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
    group: str = "faults"  # which table: "faults", "sensitivity" or "ddp"


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
    """Every fault label (or `labels`) × `seeds` × noise `levels` (spikes on unless
    `spikes` is False), plus one clean run of `clean_s` seconds per level (none when 0)."""
    specs = [
        ScenarioSpec(
            f"{label.replace('/', '-')}-s{seed}-{level_name(cv)}",
            (spec(seed),),
            seed,
            duration,
            speed,
            noise_cv=cv,
            spikes=spikes,
            step_s=step_s,
        )
        for cv in levels
        for label in labels or list(FAULTS)
        for spec, duration in [FAULTS[label]]
        for seed in seeds
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


def sim_command(spec: ScenarioSpec, url: str, token_file: Path, out: Path) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "opsboard_agent.sim",
        *("--server", url, "--token-file", str(token_file)),
        *("--nodes", str(NODES), "--gpus", str(GPUS), "--seed", str(spec.seed)),
        *("--duration", str(spec.duration), "--speed", str(spec.speed)),
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
    """Run the simulators, `parallel` at a time; every one must deliver everything."""
    waiting = list(specs)
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                spec = waiting.pop(0)
                running[spec.name] = (_sim_start(spec, clusters, url, workdir), time.monotonic())
            for name, (process, started) in list(running.items()):
                try:
                    code = process.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    if time.monotonic() - started > SIM_TIMEOUT_S:
                        raise RuntimeError(f"simulator {name} ran past {SIM_TIMEOUT_S} s") from None
                    continue
                del running[name]
                if code != 0:
                    raise RuntimeError(f"simulator {name} exited {code}: see {workdir}/{name}.log")
                log(f"simulated {name}")
    finally:
        children_stop(process for process, _ in running.values())


def _sim_start(
    spec: ScenarioSpec, clusters: dict[str, tuple[Cluster, str]], url: str, workdir: Path
) -> subprocess.Popen:
    token_file = workdir / f"{spec.name}.token"
    token_file.write_text(clusters[spec.name][1])
    token_file.chmod(0o600)
    command = sim_command(spec, url, token_file, workdir / f"{spec.name}.json")
    with open(workdir / f"{spec.name}.log", "wb") as output:
        return subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
