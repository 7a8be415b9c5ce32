import signal
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.evaluation.services import FAULTS, evaluation_run, scenario_specs
from detectors.evaluation import format_table, summarize


class Command(BaseCommand):
    help = (
        "Run the simulator's fault scenarios (every fault × 3 seeds, and a clean run) through "
        "a live stack, replay the detectors over them and print recall, false alarms, "
        "time to detect and whether the culprit was named."
    )

    def add_arguments(self, parser):
        parser.add_argument("--fault", action="append", choices=list(FAULTS), dest="labels")
        parser.add_argument("--seeds", type=int, default=3, help="seeds per fault (1..N)")
        parser.add_argument("--clean", type=float, default=7200.0, help="clean run, sim. s")
        parser.add_argument("--server", help="post to this running server instead of our own")
        parser.add_argument("--parallel", type=int, default=3, help="simulators at once")
        parser.add_argument("--step", type=float, default=5.0, help="seconds between evaluations")
        parser.add_argument("--workdir", type=Path, help="scenario files and simulator logs")
        parser.add_argument(
            "--no-ddp", action="store_true", help="skip examples/ddp_train.py (needs torch)"
        )

    def handle(self, *args, labels, seeds, clean, server, parallel, step, workdir, **options):
        # SIGTERM unwinds like Ctrl-C, so the stack this command started is stopped.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        if seeds < 1 or parallel < 1 or step <= 0:
            raise CommandError("--seeds and --parallel must be >= 1, --step > 0")
        specs = scenario_specs(labels=labels, seeds=tuple(range(1, seeds + 1)), clean_s=clean)
        if workdir:
            workdir.mkdir(parents=True, exist_ok=True)
        results = evaluation_run(
            specs=specs,
            server=server,
            parallel=parallel,
            step_s=step,
            workdir=workdir,
            ddp=not options["no_ddp"],
            log=lambda line: self.stderr.write(line),
        )
        self.stdout.write(format_table(summarize([result.score for result in results])))
        for result in results:
            for alert in result.score.false_alarms:
                self.stdout.write(
                    f"false alarm in {result.spec.name}: {alert.kind} {alert.subject} at "
                    f"+{alert.opened_at - result.scenario['base_ts']:.0f} s"
                )
