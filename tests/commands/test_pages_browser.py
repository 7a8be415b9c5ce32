"""The command buttons in Chromium on the live stack: a row appears when an operator clicks and
follows the agent's acknowledgements live (also on a viewer's page, which has no buttons); the
run's header follows a stop and a resume without a reload;
drain asks for the node's name; the overview shows draining and cordoned nodes live."""

from __future__ import annotations

import re

import pytest

from apps.clusters.models import Node
from apps.commands.models import Command
from apps.runs.models import Run
from tests.browser import screenshot
from tests.commands.conftest import client, issue
from tests.dashboard.conftest import PASSWORD, BrowserPage, chromium  # noqa: F401

pytestmark = pytest.mark.timeout(180)
LIVE = "#live-status[data-state=live]"


def person(user) -> str:
    user.set_password(PASSWORD)
    user.save()
    return user.username


def row(command_id: str, state: str) -> str:
    return f'#commands-list tr[data-command-id="{command_id}"][data-state="{state}"]'


def test_checkpoint_now_shows_a_row_that_follows_the_acks_live(chromium, live_stack, world):  # noqa: F811
    from django.contrib.auth import get_user_model

    run_url = f"{live_stack.url}/clusters/{world.cluster.name}/runs/run-1/"
    operator = BrowserPage(chromium, live_stack.url, person(world.operator))
    vik = get_user_model().objects.get(username="vik")
    viewer = BrowserPage(chromium, live_stack.url, person(vik))
    viewer.page.goto(run_url)
    viewer.page.wait_for_selector(LIVE, timeout=10_000)
    assert viewer.page.locator("[data-action]").count() == 0  # a viewer has no buttons
    assert viewer.page.locator("#commands-list tr.empty").count() == 1
    viewer.page.evaluate("window.__notReloaded = true")

    page = operator.page
    page.goto(run_url)
    page.click('[data-action="checkpoint"]')
    page.wait_for_url(re.compile(r".*/runs/run-1/#commands$"))
    command = Command.objects.get(kind="checkpoint")
    page.wait_for_selector(row(str(command.pk), "issued"))
    assert f"command {command.pk} is issued" in page.locator(".messages").inner_text()
    page.wait_for_selector(LIVE, timeout=10_000)
    page.evaluate("window.__notReloaded = true")
    # the viewer's page got the new row over its websocket
    viewer.page.wait_for_selector(row(str(command.pk), "issued"), timeout=5_000)
    assert viewer.page.locator("#commands-list tr.empty").count() == 0

    with client(live_stack, world.agent_secret) as agent:
        [polled] = agent.get("/api/v1/commands", params={"node": "node-01"}).json()["commands"]
        assert polled["id"] == str(command.pk)
        for browser in (operator, viewer):
            browser.page.wait_for_selector(row(polled["id"], "delivered"), timeout=5_000)
        ack = f"/api/v1/commands/{polled['id']}/ack"
        assert agent.post(ack, json={"state": "accepted", "step": 100}).status_code == 200
        page.wait_for_selector(row(polled["id"], "accepted"), timeout=5_000)
        assert agent.post(ack, json={"state": "succeeded"}).status_code == 200
    page.click('[data-action="resume"]')  # opens the resume form (filled from the plan)
    assert page.input_value("#resume-nodes") == "node-01, node-02"
    screenshot(page, "commands-run")
    for browser in (operator, viewer):
        done = browser.page.wait_for_selector(row(polled["id"], "succeeded"), timeout=5_000)
        assert "step: 100" in done.inner_text()
        assert browser.page.evaluate("window.__notReloaded") is True
        assert browser.page.locator("#commands-list tr[data-command-id]").count() == 1
        assert browser.errors == []
        browser.close()


def test_the_run_header_follows_a_stop_and_a_resume_live(chromium, live_stack, world):  # noqa: F811
    from django.contrib.auth import get_user_model

    run_url = f"{live_stack.url}/clusters/{world.cluster.name}/runs/run-1/"
    viewer = BrowserPage(
        chromium, live_stack.url, person(get_user_model().objects.get(username="vik"))
    )
    page = viewer.page
    page.goto(run_url)
    page.wait_for_selector(LIVE, timeout=10_000)
    assert page.inner_text("#run-state") == "running"
    assert page.locator("#run-ended").is_hidden()
    page.evaluate("window.__notReloaded = true")

    def carried_out(kind: str) -> None:
        with client(live_stack, world.operator_secret) as operator:
            command_id = issue(operator, kind=kind, run="run-1", reason="new driver").json()["id"]
        with client(live_stack, world.agent_secret) as agent:
            ack = f"/api/v1/commands/{command_id}/ack"
            assert agent.post(ack, json={"state": "accepted"}).status_code == 200
            assert agent.post(ack, json={"state": "succeeded"}).status_code == 200

    carried_out("stop")
    page.wait_for_selector('#run-state[data-state="stopped"]', timeout=5_000)
    ended = page.locator("#run-ended")
    assert ended.is_visible()
    stopped_at = Run.objects.get(pk=world.run.pk).ended_at
    assert ended.inner_text().startswith(f"Ended stopped at {stopped_at:%Y-%m-%d %H:%M:%S} UTC")
    carried_out("resume")
    page.wait_for_selector('#run-state[data-state="running"]', timeout=5_000)
    assert page.inner_text("#run-state") == "running" and ended.is_hidden()
    assert page.evaluate("window.__notReloaded") is True
    assert viewer.errors == []
    viewer.close()


def test_drain_wants_the_name_and_the_overview_shows_it_live(chromium, live_stack, world):  # noqa: F811
    base = f"{live_stack.url}/clusters/{world.cluster.name}/"
    operator = BrowserPage(chromium, live_stack.url, person(world.operator))
    overview = operator.context.new_page()
    overview.goto(base)
    overview.wait_for_selector(LIVE, timeout=10_000)
    assert overview.locator("#nodes-out").inner_text().startswith("0 cordoned · 0 draining")
    assert overview.locator(".node-badge:visible").count() == 0

    page = operator.page
    page.goto(f"{base}nodes/node-01/")
    page.click('[data-action="drain"]')
    page.fill("#drain-reason", "XID 79")
    page.fill("#drain-confirm", "node-02")
    page.click('[data-action="drain-submit"]')
    error = page.wait_for_selector("#drain-confirm-errors")
    assert "type node-01 exactly" in error.inner_text()
    assert Command.objects.count() == 0
    assert page.input_value("#drain-reason") == "XID 79"
    page.fill("#drain-confirm", "node-01")
    page.click('[data-action="drain-submit"]')
    page.wait_for_url(re.compile(r".*/nodes/node-01/#commands$"))
    drain = Command.objects.get(kind="drain")
    # the drain hook runs in the worker: the row, then the node's state, follow live
    page.wait_for_selector(row(str(drain.pk), "accepted"))
    page.wait_for_selector('#node-state[data-state="draining"]', timeout=10_000)
    assert page.locator('[data-action="drain"]').count() == 0

    badge = '.node-card[data-node="node-01"] .node-badge[data-node-state="draining"]'
    overview.wait_for_selector(badge, state="visible", timeout=5_000)
    assert overview.locator("#count-draining").inner_text() == "1"

    page.goto(f"{base}nodes/node-02/")
    page.fill("#cordon-reason", "fan noise")
    page.click('[data-action="cordon"]')
    page.wait_for_url(re.compile(r".*/nodes/node-02/#commands$"))
    # the page offers the uncordon at once, though the hook may not have run yet
    assert page.locator('[data-action="uncordon"]').count() == 1
    page.wait_for_selector('#node-state[data-state="cordoned"]', timeout=10_000)
    assert Node.objects.get(pk=world.node2.pk).state == "cordoned"
    badge = '.node-card[data-node="node-02"] .node-badge[data-node-state="cordoned"]'
    overview.wait_for_selector(badge, state="visible", timeout=5_000)
    assert overview.locator("#count-cordoned").inner_text() == "1"
    # the reason goes with the badge, live, on the card and on the node's page
    reason = overview.locator('.node-card[data-node="node-02"] .node-reason')
    assert (reason.inner_text(), reason.is_visible()) == ("fan noise", True)
    page.wait_for_selector("#node-reason:visible", timeout=5_000)
    assert page.locator("#node-reason").inner_text() == "Out of run plans: fan noise"
    screenshot(overview, "commands-overview")
    overview.reload()
    assert overview.locator("#nodes-out").inner_text().startswith("1 cordoned · 1 draining")
    # the only console error: the refused form's own answer (400, the form again)
    assert operator.errors == [
        "Failed to load resource: the server responded with a status of 400 (Bad Request)"
    ]
    operator.close()
