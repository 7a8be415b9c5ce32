"""Playwright driving a Chromium that the machine has (`make test` finds or installs one:
launcher/browser.py): shared by the page tests."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from launcher.browser import HOW_TO_GET_ONE, chromium_find

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@functools.cache
def chromium_path() -> str:
    """The browser `make test` chose (it sets CHROMIUM), else the first one found."""
    found = chromium_find()
    if found is None:
        raise RuntimeError(HOW_TO_GET_ONE)
    return found


def log_in(page, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/clusters/.*|.*/$"))


def screenshot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
