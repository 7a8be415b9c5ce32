"""Rebuild the rollups from the raw data of the last N days (data stored before the history
app existed, or after restoring raw data): `python manage.py history_rebuild --days 7`."""

from datetime import timedelta

from django.core.management.base import BaseCommand
from django.utils import timezone

from apps.history.services import rollups_rebuild


class Command(BaseCommand):
    help = "Recompute the 1-minute and 1-hour rollups from raw data."

    def add_arguments(self, parser):
        parser.add_argument("--days", type=float, default=7.0)
        parser.add_argument("--window-hours", type=float, default=6.0)

    def handle(self, *args, days: float, window_hours: float, **options):
        end = timezone.now() + timedelta(minutes=1)
        result = rollups_rebuild(
            start=end - timedelta(days=days), end=end, window=timedelta(hours=window_hours)
        )
        self.stdout.write(f"rolled up {result.claimed} dirty ranges in {result.rounds} rounds")
