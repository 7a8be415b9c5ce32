"""/api/v1/docs works on a machine that reaches nothing outside: Swagger UI comes from our
own static files, and a real browser showing it asks no other host for anything."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from django.test import Client

from tests.dashboard.conftest import BrowserPage, chromium, operator  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

ASSET = re.compile(r'(?:src|href)="([^"]+)"')


def test_the_docs_page_names_no_external_host_and_its_assets_answer(live_db):
    client = Client()
    page = client.get("/api/v1/docs")
    assert page.status_code == 200
    html = page.content.decode()
    assets = ASSET.findall(html)
    assert any(a.endswith(".js") and "swagger-ui-bundle" in a for a in assets), assets
    assert any("swagger-ui" in a and a.endswith(".css") for a in assets), assets
    for asset in assets:
        parts = urlsplit(asset)
        assert not parts.netloc and not parts.scheme, f"{asset} is on another host"
        assert client.get(asset).status_code == 200, asset
    assert '"validatorUrl": null' in html  # no badge fetched from the public validator


def test_a_browser_shows_the_docs_asking_only_our_server(chromium, live_stack, live_db):  # noqa: F811
    operator("op")
    browser = BrowserPage(chromium, live_stack.url, "op")
    try:
        browser.requests.clear()
        browser.page.goto(f"{live_stack.url}/api/v1/docs")
        # drawn from the schema it fetched: the title and the ingest operation
        browser.page.wait_for_selector(".swagger-ui .info .title", timeout=15_000)
        browser.page.wait_for_selector('[data-path="/api/v1/ingest"]', timeout=15_000)
        ours = urlsplit(live_stack.url).netloc
        foreign = [url for url in browser.requests if urlsplit(url).netloc not in (ours, "")]
        assert foreign == [], foreign
        assert browser.errors == [], browser.errors  # CSP violations would show here
    finally:
        browser.close()
