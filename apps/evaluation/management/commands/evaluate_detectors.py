import signal
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.evaluation.services import (
    DDP_JOBS,
    LABELS,
    NOISE_LEVELS,
    ScenarioResult,
    demo_specs,
    evaluation_replay,
    evaluation_run,
    scenario_specs,
    sensitivity_specs,
)
from apps.evaluation.services.scenarios import CLEAN_STEP_S
from detectors.evaluation import format_sensitivity, format_table, summarize
from detectors.incident_evaluation import format_folding, summarize_folding


def level_title(cv: float) -> str:
    return f"CV {round(cv * 100)} %"


class Command(BaseCommand):
    help = (
        "Run the simulator's fault scenarios (every fault × 3 seeds at each noise level, and "
        "a clean run per level) and examples/ddp_train.py jobs through a live stack, replay "
        "the detectors over them and print recall, false alarms, time to detect and whether "
        "the culprit was named, per noise level."
    )

    def add_arguments(self, parser):
        parser.add_argument("--fault", action="append", choices=LABELS, dest="labels")
        parser.add_argument("--seeds", type=int, default=3, help="seeds per fault (1..N)")
        parser.add_argument(
            "--noise",
            type=float,
            action="append",
            dest="levels",
            help=f"simulator noise CV, repeatable (default: {NOISE_LEVELS})",
        )
        parser.add_argument("--no-spikes", action="store_true", help="turn the 2-5x spikes off")
        parser.add_argument("--clean", type=float, default=7200.0, help="clean run, sim. s")
        parser.add_argument(
            "--clean-step", type=float, default=CLEAN_STEP_S, help="clean run's replay period"
        )
        parser.add_argument(
            "--sensitivity",
            action="store_true",
            help="also play stragglers of 1.2x, 1.5x and 2x at each level and print their table",
        )
        parser.add_argument(
            "--demo",
            action="store_true",
            help="also play make demo's first ten minutes, fresh and restarted, and print "
            "what they raised beyond the faults the demo injects",
        )
        parser.add_argument("--server", help="post to this running server instead of our own")
        parser.add_argument("--parallel", type=int, default=3, help="simulators at once")
        parser.add_argument("--step", type=float, default=5.0, help="seconds between evaluations")
        parser.add_argument("--workdir", type=Path, help="scenario files and simulator logs")
        parser.add_argument(
            "--replay-from",
            type=Path,
            metavar="WORKDIR",
            help="judge an earlier run's stored scenarios again (same options, its --workdir)",
        )
        parser.add_argument(
            "--no-ddp", action="store_true", help="skip examples/ddp_train.py (needs torch)"
        )

    def handle(self, *args, labels, seeds, levels, clean, server, parallel, step, workdir, **o):
        # SIGTERM unwinds like Ctrl-C, so the stack this command started is stopped.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        levels = tuple(levels or NOISE_LEVELS)
        if seeds < 1 or parallel < 1 or step <= 0 or o["clean_step"] <= 0:
            raise CommandError("--seeds and --parallel must be >= 1, --step and --clean-step > 0")
        if not all(0 <= cv <= 2 for cv in levels):
            raise CommandError("--noise must be in [0, 2]")
        seed_range = tuple(range(1, seeds + 1))
        noise = {"levels": levels, "spikes": not o["no_spikes"], "step_s": step}
        specs = scenario_specs(
            labels=labels, seeds=seed_range, clean_s=clean, clean_step_s=o["clean_step"], **noise
        )
        if o["sensitivity"]:
            specs += sensitivity_specs(seeds=seed_range, **noise)
        if o["demo"]:
            specs += demo_specs(step_s=step)
        ddp = () if o["no_ddp"] else DDP_JOBS
        if o["replay_from"]:
            results = evaluation_replay(
                specs=specs, workdir=o["replay_from"], ddp=ddp, log=self.stderr.write
            )
            self.report(results, levels, spikes=not o["no_spikes"])
            return
        if workdir:
            workdir.mkdir(parents=True, exist_ok=True)
        results = evaluation_run(
            specs=specs,
            server=server,
            parallel=parallel,
            workdir=workdir,
            ddp=ddp,
            log=lambda line: self.stderr.write(line),
        )
        self.report(results, levels, spikes=not o["no_spikes"])

    def report(self, results: list[ScenarioResult], levels: tuple[float, ...], spikes: bool):
        by_level = {
            cv: [r for r in results if r.spec.group == "faults" and r.spec.noise_cv == cv]
            for cv in levels
        }
        for cv, level in by_level.items():
            if not level:
                continue
            faults = [f for r in level for f in r.score.faults]
            times = sorted(f.time_to_detect for f in faults if f.time_to_detect is not None)
            median = f"{times[len(times) // 2]:.0f} s" if times else "—"
            self.stdout.write(
                f"\n### Simulated faults, noise {level_title(cv)}, spikes "
                f"{'on' if spikes else 'off'}: recall {sum(f.found for f in faults)}/"
                f"{len(faults)}, median time to detect {median}\n"
            )
            self.stdout.write(format_table(summarize([r.score for r in level])))
            self.stdout.write(f"\n#### Incidents, noise {level_title(cv)}: one per fault\n")
            folding = [r.folding for r in level if r.folding is not None]
            self.stdout.write(format_folding(summarize_folding(folding)))
        ddp = [r for r in results if r.spec.group == "ddp"]
        if ddp:
            self.stdout.write("\n### examples/ddp_train.py under torchrun (4 gloo CPU ranks)\n")
            self.stdout.write(format_table(summarize([r.score for r in ddp])))
        sensitivity = {
            level_title(cv): summarize(
                [
                    r.score
                    for r in results
                    if r.spec.group == "sensitivity" and r.spec.noise_cv == cv
                ]
            )
            for cv in levels
        }
        if any(sensitivity.values()):
            self.stdout.write("\n### Straggler sensitivity (spikes on)\n")
            self.stdout.write(format_sensitivity(sensitivity))
        demo = [r for r in results if r.spec.group == "demo"]
        if demo:
            self.stdout.write(
                "\n### make demo's first ten minutes (seed 1, 8 × 8 GPUs, a sample a second)\n"
            )
            self.stdout.write(demo_table(demo))
        for result in results:
            for alert in result.score.false_alarms:
                self.stdout.write(
                    f"false alarm in {result.spec.name}: {alert.kind} {alert.subject} at "
                    f"+{alert.opened_at - result.scenario['base_ts']:.0f} s"
                )


def demo_table(results: list[ScenarioResult]) -> str:
    """A Markdown table: per demo start, the injected faults found (with their times to
    detect), the alerts nothing injected explains, and how its incidents folded (one per
    fault with the right root: its thermal GPU's straggler folded under the heat)."""
    lines = [
        "| start | faults found | time to detect | false alarms | of which oom_risk "
        "| one incident per fault | false folds |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        faults = result.score.faults
        times = ", ".join(
            f"{f.label} {max(0.0, f.time_to_detect):.0f} s"
            for f in faults
            if f.time_to_detect is not None
        )
        false = result.score.false_alarms
        folds = result.folding.faults if result.folding else ()
        lines.append(
            f"| {result.spec.name.removeprefix('demo-')} | {sum(f.found for f in faults)}/"
            f"{len(faults)} | {times or '—'} | {len(false)} "
            f"| {sum(a.kind == 'oom_risk' for a in false)} "
            f"| {sum(f.right for f in folds)}/{len(folds)} "
            f"| {result.folding.false_folds if result.folding else '—'} |"
        )
    return "\n".join(lines)
