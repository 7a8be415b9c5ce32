"""A page's command list follows the UTC/local switch (static/js/timezone.js): the issue times
of the rows the server drew and of a row a live `command` message adds, and the column's label.
"""

from __future__ import annotations

from datetime import UTC, tzinfo
from zoneinfo import ZoneInfo

import pytest

from apps.commands.models import Command
from apps.commands.services import command_issue
from apps.runs.models import Run
from tests.browser import log_in
from tests.dashboard.conftest import PASSWORD, RUN, chromium, cluster_store, operator  # noqa: F401
from tests.dashboard.test_pages_a11y import off_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

ZONE = "America/New_York"  # the browser's own zone: never UTC, so the switch shows
LIVE = "#live-status[data-state=live]"


def checkpoint_issued(user, run: Run, key: str) -> Command:
    """A checkpoint command, issued away from Playwright's event loop (it broadcasts)."""
    made: list[Command] = []
    off_thread(
        lambda: made.append(
            command_issue(
                user=user, cluster=run.cluster, kind="checkpoint", run=run, idempotency_key=key
            )[0]
        )
    )
    return made[0]


def issued_cell(page, command: Command) -> str:
    return page.inner_text(f'#commands-list tr[data-command-id="{command.pk}"] td.issued')


def wall_clock(command: Command, zone: tzinfo) -> str:
    return command.issued_at.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S")


def test_command_issue_times_follow_the_zone_switch_live_rows_too(chromium, live_stack, live_db):  # noqa: F811
    user = operator("op")
    run = Run.objects.get(cluster=cluster_store("cmdzones", nodes=1, gpus=2), name=RUN)
    drawn = checkpoint_issued(user, run, "drawn-by-the-server")
    local = ZoneInfo(ZONE)
    assert wall_clock(drawn, local) != wall_clock(drawn, UTC)
    context = chromium.new_context(viewport={"width": 1400, "height": 900}, timezone_id=ZONE)
    try:
        page = context.new_page()
        log_in(page, live_stack.url, "op", PASSWORD)
        page.goto(f"{live_stack.url}/clusters/{run.cluster.name}/runs/{RUN}/")
        page.wait_for_selector(LIVE, timeout=10_000)
        assert issued_cell(page, drawn) == wall_clock(drawn, UTC)
        assert page.locator("#commands-list th", has_text="Issued (UTC)").count() == 1

        page.click("#zone-switch")
        assert issued_cell(page, drawn) == wall_clock(drawn, local)
        label = f"Issued (local time, {ZONE})"
        assert page.locator("#commands-list th", has_text=label).count() == 1
        added = checkpoint_issued(user, run, "added-live")
        page.wait_for_selector(f'#commands-list tr[data-command-id="{added.pk}"]', timeout=5_000)
        assert issued_cell(page, added) == wall_clock(added, local)

        page.click("#zone-switch")
        assert issued_cell(page, added) == wall_clock(added, UTC)
        assert issued_cell(page, drawn) == wall_clock(drawn, UTC)
    finally:
        context.close()
