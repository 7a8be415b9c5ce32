from django.core.management.base import BaseCommand
from django.utils import timezone

from apps.telemetry.services import chunks_compact


class Command(BaseCommand):
    help = "Merge the per-batch sample chunks of finished windows into one chunk per series."

    def add_arguments(self, parser):
        parser.add_argument("--lookback-windows", type=int, default=6)

    def handle(self, *args, lookback_windows: int, **options):
        written = chunks_compact(now=timezone.now(), lookback_windows=lookback_windows)
        self.stdout.write(f"{written} chunk rows written")
