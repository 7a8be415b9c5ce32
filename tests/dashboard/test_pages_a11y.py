"""Every page, at desktop and phone width, in Chromium: a screenshot of each in
tests/artifacts/screens/<page>-<width>.png, axe-core finds nothing serious or critical, and
no page is wider than the viewport (a wide table scrolls in its own box or wraps).

The pages are the named URL patterns outside the API and the admin, found at test time, so a
page added later is checked without touching this file; one whose URL takes an argument not
in PAGE_ARGS fails the test until a value is added there. Patterns that refuse GET (405:
acknowledge, log out) and the exports (the charts' and the ledger's CSV/JSON, a run report's
Markdown) are not pages.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.db import connections
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from apps.alerts.models import Alert
from apps.alerts.services import alerts_sync
from detectors.types import Finding
from tests.browser import ARTIFACTS, log_in
from tests.dashboard.conftest import PASSWORD, RUN, cluster_store, operator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

SCREENS = ARTIFACTS / "screens"
WIDTHS = {1440: 900, 390: 844}  # desktop, phone: viewport width → height
BLOCKING = ("serious", "critical")

# A value for each URL argument; per-page values where one page needs another than the rest.
PAGE_ARGS: dict[str, object] = {"run": RUN, "node": "node-00", "rank": 2, "gpu": 1}
PAGE_ARGS_BY_NAME: dict[str, dict[str, object]] = {
    "run-command": {"kind": "checkpoint"},
    "node-command": {"kind": "drain"},
}
NOT_PAGES = ("api/", "admin/")


def named_patterns(resolver: URLResolver | None = None, prefix: str = "", args=()):
    """(name, route, URL arguments) of every named URL pattern, includes followed."""
    for entry in (resolver or get_resolver()).url_patterns:
        route = prefix + str(entry.pattern)
        names = (*args, *getattr(entry.pattern, "converters", {}))
        if isinstance(entry, URLResolver):
            yield from named_patterns(entry, route, names)
        elif isinstance(entry, URLPattern) and entry.name:
            yield entry.name, route, names


def page_urls(values: dict[str, object]) -> dict[str, str]:
    """URL of every page candidate, by URL name."""
    urls = {}
    for name, route, args in named_patterns():
        if route.startswith(NOT_PAGES) or name.endswith(("-json", "-csv", "-md")):
            continue
        given = {**values, **PAGE_ARGS_BY_NAME.get(name, {})}
        missing = set(args) - set(given)
        assert not missing, f"page {name!r} ({route}) takes {missing}: add a value to PAGE_ARGS"
        urls[name] = reverse(name, kwargs={arg: given[arg] for arg in args})
    return urls


def off_thread(work) -> None:
    """ORM work that broadcasts (async_to_sync) away from Playwright's event loop."""

    def run() -> None:
        try:
            work()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(run).result()


def seeded() -> dict[str, object]:
    """A cluster with a run, two nodes, and an open alert of each kind of subject."""
    cluster = cluster_store("a11y")
    findings = [
        Finding(kind="straggler", subject=f"run:{RUN}/rank:2", severity="warning",
                summary="rank 2 computes 30% slower than its peers", run=RUN, node="node-00",
                rank=2, gpu=2),
        Finding(kind="xid", subject="node:node-00/gpu:1", severity="critical",
                summary="XID 79 on node-00 GPU 1", node="node-00", gpu=1),
    ]  # fmt: skip
    off_thread(lambda: alerts_sync(cluster=cluster, findings=findings, now=time.time()))
    alert = Alert.objects.get(kind="straggler")
    values = {"cluster": cluster.name, "alert_id": alert.id, "incident_id": alert.incident_id}
    return {**PAGE_ARGS, **values}


def blocking_violations(page) -> list[str]:
    results = Axe().run(page)
    return [
        f"{violation['id']} ({violation['impact']}): {violation['help']} — "
        + "; ".join(" ".join(node["target"]) for node in violation["nodes"][:5])
        for violation in results.response["violations"]
        if violation["impact"] in BLOCKING
    ]


# The page's width, and when it is wider than the viewport the outermost elements that reach
# past its right edge (outside any box that scrolls or clips them), to name the culprit.
PAGE_WIDTH_JS = """() => {
  const viewport = document.documentElement.clientWidth;
  const clipped = (el) => {
    for (let up = el.parentElement; up; up = up.parentElement) {
      if (getComputedStyle(up).overflowX !== "visible") return true;
    }
    return false;
  };
  const past = (el) => el.getBoundingClientRect().right > viewport + 1;
  const wide = [...document.body.querySelectorAll("*")].filter(
    (el) => past(el) && !past(el.parentElement) && !clipped(el));
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
    [...el.classList].map((c) => "." + c).join("");
  return {
    scroll: document.documentElement.scrollWidth,
    wide: wide.slice(0, 5).map(
      (el) => `${name(el)} (right edge ${Math.round(el.getBoundingClientRect().right)} px)`),
  };
}"""


def wider_than_viewport(page, width: int) -> list[str]:
    found = page.evaluate(PAGE_WIDTH_JS)
    if found["scroll"] <= width + 1:
        return []
    return [f"{found['scroll']} px wide, past the edge: {', '.join(found['wide']) or '?'}"]


def check_page(browser, url: str, name: str, width: int, storage_state=None) -> list[str]:
    context = browser.new_context(
        viewport={"width": width, "height": WIDTHS[width]}, storage_state=storage_state
    )
    try:
        page = context.new_page()
        response = page.goto(url, wait_until="networkidle")
        assert response is not None and response.status == 200, f"{name}: {url}"
        page.screenshot(path=str(SCREENS / f"{name}-{width}.png"), full_page=True)
        found = blocking_violations(page) + wider_than_viewport(page, width)
        return [f"{name} at {width}px: {problem}" for problem in found]
    finally:
        context.close()


def test_every_page_at_desktop_and_phone_width_has_no_serious_accessibility_violation(
    chromium, live_stack, live_db
):
    SCREENS.mkdir(parents=True, exist_ok=True)
    operator("op")
    urls = page_urls(seeded())
    login = urls.pop("login")
    session = chromium.new_context()
    log_in(session.new_page(), live_stack.url, "op", PASSWORD)
    state = session.storage_state()
    session.close()

    found: list[str] = []
    checked: list[str] = []
    for width in WIDTHS:
        found += check_page(chromium, live_stack.url + login, "login", width)
        for name, path in urls.items():
            probe = chromium.new_context(storage_state=state)
            status = probe.request.get(live_stack.url + path, max_redirects=0).status
            probe.close()
            if status == 405:  # takes POST only: an action, not a page
                continue
            found += check_page(chromium, live_stack.url + path, name, width, state)
            checked.append(name)
    assert {"home", "cluster-overview", "run-detail", "node-detail", "alerts", "audit"} <= set(
        checked
    )
    assert not found, "\n".join(found)
