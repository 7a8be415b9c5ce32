"""Content-Security-Policy (django-csp): every page carries a policy whose scripts come only
from our own origin, and the pages work under it in a real browser (no violation, charts
drawn, the live socket open)."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.dashboard.conftest import (  # noqa: F401
    RUN,
    BrowserPage,
    chromium,
    cluster_store,
    operator,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

# collected in the page before any of its scripts runs (Playwright's init script is not
# subject to the page's policy)
RECORD_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) =>
  window.__csp.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`));
"""


def directives(header: str) -> dict[str, list[str]]:
    parts = (part.split() for part in header.split(";") if part.strip())
    return {name: values for name, *values in parts}


def pages(cluster) -> list[str]:
    return [
        "/",
        f"/clusters/{cluster.name}/",
        f"/clusters/{cluster.name}/runs/{RUN}/",
        f"/clusters/{cluster.name}/nodes/node-00/",
        "/alerts/",
        "/accounts/login/",
        "/admin/login/",
        "/api/v1/docs",
    ]


def test_every_page_carries_a_policy_with_scripts_from_self_only(live_db):
    cluster = cluster_store("alpha", nodes=1, gpus=2, steps=3)
    client = Client()
    client.force_login(operator())
    for path in pages(cluster):
        response = client.get(path, follow=True)
        assert response.status_code == 200, path
        policy = directives(response["Content-Security-Policy"])
        assert policy["script-src"] == ["'self'"], path
        assert "'unsafe-inline'" not in policy.get("script-src-elem", []), path
        assert policy["default-src"] == ["'self'"], path
        assert policy["object-src"] == ["'none'"], path
        assert policy["frame-ancestors"] == ["'none'"], path
        assert policy["base-uri"] == ["'self'"], path
        assert policy["img-src"] == ["'self'", "data:"], path


def test_the_websocket_port_is_allowed_and_nothing_wider(live_db, settings):
    settings.LIVE_WS_PORT = "8766"
    client = Client()
    client.force_login(operator())
    policy = directives(client.get("/", follow=True)["Content-Security-Policy"])
    assert policy["connect-src"] == ["'self'", "ws://testserver:8766", "wss://testserver:8766"]


def test_the_pages_run_under_the_policy_in_a_browser(chromium, live_stack, live_db):  # noqa: F811
    cluster = cluster_store("alpha", nodes=1, gpus=2, steps=10)
    operator("op")
    browser = BrowserPage(chromium, live_stack.url, "op")
    browser.context.add_init_script(RECORD_VIOLATIONS)
    page = browser.page
    try:
        for path, charts in (
            (f"/clusters/{cluster.name}/", 0),
            (f"/clusters/{cluster.name}/runs/{RUN}/", 1),
            (f"/clusters/{cluster.name}/nodes/node-00/", 1),
        ):
            response = page.goto(f"{live_stack.url}{path}")
            assert "script-src 'self'" in response.headers["content-security-policy"]
            page.wait_for_selector("#live-status[data-state=live]", timeout=10_000)
            if charts:
                page.wait_for_selector(".js-plotly-plot .main-svg", timeout=15_000)
                # drawn with its layout: a plot area of real size, not an unstyled stub
                box = page.locator(".js-plotly-plot .main-svg").first.bounding_box()
                assert box and box["width"] > 200 and box["height"] > 100, path
            assert page.evaluate("window.__csp") == [], path
        assert not [e for e in browser.errors if "Content Security Policy" in e], browser.errors
    finally:
        browser.close()
