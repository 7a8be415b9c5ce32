from dataclasses import asdict

from celery import shared_task
from django.utils import timezone

from apps.core.db_nice import background_db
from apps.runs.changes import step_changes_prune
from apps.runs.compaction import steps_compact
from apps.runs.completions import completions_refresh
from apps.runs.retention import run_events_prune


@shared_task(name="runs.steps_compact", ignore_result=True)
def compact_steps() -> int:
    with background_db():
        return steps_compact(now=timezone.now())


@shared_task(name="runs.events_prune", ignore_result=True)
def prune_events() -> dict:
    """Run events past their retention or their run's cap (beat, RETENTION_INTERVAL)."""
    with background_db():
        return asdict(run_events_prune(now=timezone.now()))


@shared_task(name="runs.completions_refresh", ignore_result=True)
def refresh_completions() -> int:
    """The step completions of the steps ingest marked, and the step change log pruned
    (beat, STEP_COMPLETIONS_INTERVAL)."""
    with background_db():
        step_changes_prune()
        return completions_refresh()
