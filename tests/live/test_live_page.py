"""The cluster page in a real browser: it lists the nodes and updates live without reload."""

import os
import time

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import sync_playwright

from tests.browser import CHROMIUM, CHROMIUM_ARGS, log_in, screenshot
from tests.conftest import make_batch

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def chromium():
    # Playwright's sync API keeps an event loop on this thread; the ORM calls of the test
    # itself are synchronous all the same (the documented pytest-django/Playwright setting).
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()
    del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


def gpu_batch(node: str, util: float, temp: float) -> dict:
    batch = make_batch(node=node, samples=0, node_info={"gpus": 2})
    now = time.time()
    batch["samples"] = [
        {"ts": now, "metric": metric, "gpu": gpu, "value": value}
        for gpu in range(2)
        for metric, value in (("gpu.util", util), ("gpu.temp_c", temp))
    ]
    return batch


def test_the_cluster_page_updates_a_node_live_without_reload(
    chromium, live_stack, agent, agent_token
):
    get_user_model().objects.create_user("op", password="a-long-test-password")
    assert agent.post(gpu_batch("node-a", 50.0, 60.0)).status_code == 202
    assert agent.post(gpu_batch("node-b", 70.0, 61.0)).status_code == 202
    cluster = agent_token[0].cluster.name
    deadline = time.monotonic() + 30
    from apps.telemetry.models import NodeHealth

    while NodeHealth.objects.filter(node__cluster__name=cluster).count() < 4:
        assert time.monotonic() < deadline, "the worker did not store the first batches"
        time.sleep(0.1)

    context = chromium.new_context()
    page = context.new_page()
    errors = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    log_in(page, live_stack.url, "op", "a-long-test-password")
    page.goto(f"{live_stack.url}/clusters/{cluster}/")
    page.wait_for_selector("#live-status[data-state=live]", timeout=10_000)
    rows = page.locator("#nodes tbody tr")
    assert rows.count() == 2
    assert page.locator('tr[data-node="node-b"] td.util').inner_text() == "70.0 %"
    page.evaluate("window.__notReloaded = true")

    assert agent.post(gpu_batch("node-b", 12.5, 91.0)).status_code == 202
    page.wait_for_function(
        """() => document.querySelector('tr[data-node="node-b"] td.util').textContent
              === '12.5 %'""",
        timeout=5_000,
    )
    assert page.locator('tr[data-node="node-b"]').get_attribute("data-health") == "critical"
    assert page.evaluate("window.__notReloaded") is True
    screenshot(page, "cluster-nodes-live")
    assert errors == []
    context.close()
