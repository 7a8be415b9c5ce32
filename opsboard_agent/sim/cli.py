"""`opsboard-sim` / `python -m opsboard_agent.sim`: simulate a cluster against a server.

    python -m opsboard_agent.sim --server http://127.0.0.1:8000 --token-file token \\
        --nodes 4 --gpus 8 --runs 2 --seed 7 --duration 600 --speed 10 \\
        --fault straggler:rank=5,at=60,factor=1.4 --fault xid:node=2,gpu=3,at=200 \\
        --noise-cv 0.1 --spikes --scenario-out scenario.json

Prints one JSON line of counts when done; exits 0 when everything was delivered, 1 when
some batch was rejected, dropped or is still spooled, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from opsboard_agent.sim.driver import Driver
from opsboard_agent.sim.faults import SUBJECT, fault_parse
from opsboard_agent.sim.layout import layout_build
from opsboard_agent.sim.model import ClusterModel, SimConfig
from opsboard_agent.sim.noise import Noise
from opsboard_agent.sim.scenario import scenario_build, scenario_write

log = logging.getLogger("opsboard_agent.sim")

# The contract takes timestamps up to 7 days old; leave a day for delivery.
MAX_DURATION_S = 6 * 86400
# A busy shared cluster, not a quiet lab: 10 % jitter per step and a spike every ~100 steps.
DEFAULT_NOISE_CV, DEFAULT_SPIKE_RATE = 0.1, 0.01


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opsboard-sim",
        description=__doc__.split("\n")[0],
        epilog=f"fault kinds: {', '.join(SUBJECT)} (see docs/simulator.md)",
    )
    parser.add_argument("--server", help="base URL of the Opsboard server")
    parser.add_argument("--token-file", type=Path, help="file holding the cluster's agent token")
    parser.add_argument("--token", help="the agent token itself (visible in ps: prefer a file)")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs (ranks) per node")
    parser.add_argument("--runs", type=int, default=1, help="runs sharing the nodes")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel shards per node")
    parser.add_argument("--prefix", default="sim", help="of node and run names")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--duration", type=float, default=600.0, help="simulated seconds")
    parser.add_argument(
        "--speed", type=float, default=1.0, help="simulated seconds per wall second (>= 1)"
    )
    parser.add_argument("--step-time", type=float, default=1.0, help="nominal seconds per step")
    parser.add_argument(
        "--interval", type=float, default=10.0, help="telemetry sample interval (simulated s)"
    )
    parser.add_argument("--check-every", type=int, default=10, help="steps between SDC checks")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="steps between saves")
    parser.add_argument(
        "--noise-cv",
        type=float,
        default=DEFAULT_NOISE_CV,
        help="per-step lognormal jitter of every rank's phases, as a coefficient of variation "
        "(0 for the old near-noiseless model)",
    )
    parser.add_argument(
        "--spikes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="rare 2-5x compute spikes on a random rank (GC pauses, pre-emption)",
    )
    parser.add_argument(
        "--spike-rate", type=float, default=DEFAULT_SPIKE_RATE, help="spikes per step of a run"
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND:key=value,...",
        help="inject a fault, e.g. straggler:rank=5,at=60,factor=1.4 (repeatable)",
    )
    parser.add_argument(
        "--ago",
        type=float,
        default=0.0,
        help="end the timeline this many seconds before now (an earlier session of a cluster"
        " that is then simulated again, as `make demo` started twice)",
    )
    parser.add_argument("--scenario-out", type=Path, help="write the scenario JSON here")
    parser.add_argument("--spool-dir", type=Path, help="default: a fresh temporary directory")
    parser.add_argument("--drain-timeout", type=float, default=60.0)
    parser.add_argument(
        "--end-runs",
        action="store_true",
        help="end the runs when the simulation ends (run_end finished); by default they just"
        " stop reporting, as a window of a longer job",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="generate (and write the scenario) without sending"
    )
    parser.add_argument("--log-level", default="WARNING")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not 0 < args.duration <= MAX_DURATION_S:
        parser.error(f"--duration must be in (0, {MAX_DURATION_S}] simulated seconds")
    if not 0 <= args.ago <= MAX_DURATION_S - args.duration:
        parser.error("--ago must be >= 0 and leave the timeline within the last 6 days")
    if not args.speed >= 1:
        parser.error("--speed must be >= 1 (timestamps may not run ahead of the wall clock)")
    try:
        layout = layout_build(
            nodes=args.nodes, gpus=args.gpus, runs=args.runs, tp=args.tp, prefix=args.prefix
        )
        faults = [fault_parse(spec, layout) for spec in args.fault]
        config = SimConfig(
            seed=args.seed,
            step_time=args.step_time,
            interval=args.interval,
            check_every=args.check_every,
            checkpoint_every=args.checkpoint_every,
            noise=Noise(cv=args.noise_cv, spike_rate=args.spike_rate if args.spikes else 0.0),
        )
    except ValueError as exc:
        parser.error(str(exc))
    token = args.token
    if not args.dry_run:
        if token is None and args.token_file is not None:
            try:
                token = args.token_file.read_text().strip()
            except OSError as exc:
                parser.error(f"cannot read the token file: {exc}")
        if not args.server or not token:
            parser.error("--server and --token-file (or --token) are required, or --dry-run")
    model = ClusterModel(layout, faults, config)
    # One anchor: simulated second t is base_ts + t, and the last one is about "now" (or
    # `--ago` seconds before it).
    base_ts = time.time() - args.duration * (1.0 - 1.0 / args.speed) - args.ago
    if args.scenario_out:
        scenario = scenario_build(model, base_ts=base_ts, duration=args.duration, speed=args.speed)
        scenario_write(scenario, args.scenario_out)
    if args.dry_run:
        tick = model.advance(args.duration)
        counts = {
            "samples": len(tick.samples),
            "steps": len(tick.steps),
            "events": len(tick.events),
        }
        print(json.dumps({"dry_run": True, **counts}))
        return 0
    return _drive(args, model, token or "", base_ts)


def _drive(args: argparse.Namespace, model: ClusterModel, token: str, base_ts: float) -> int:
    spool_dir = args.spool_dir or Path(tempfile.mkdtemp(prefix="opsboard-sim-"))
    driver = Driver(
        model,
        server=args.server,
        token=token,
        base_ts=base_ts,
        duration=args.duration,
        speed=args.speed,
        spool_dir=spool_dir,
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.warning("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        driver.run(stop)
    finally:
        result = driver.close(drain_timeout=args.drain_timeout, end_runs=args.end_runs)
    print(json.dumps({**vars(result), "ok": result.ok}), flush=True)
    if result.ok and args.spool_dir is None:
        shutil.rmtree(spool_dir, ignore_errors=True)
    elif not result.ok:
        log.error("not everything was delivered; what is left is in %s", spool_dir)
    return 0 if result.ok else 1
