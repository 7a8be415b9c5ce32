"""The Chromium the browser tests drive: found where a machine keeps one, else installed.

`chromium_find()` looks, in order, at the `CHROMIUM` environment variable, Playwright's own
download, and `chromium` / `chromium-browser` / `google-chrome` on PATH. `chromium_ensure()`
(run by `make test` before the suite) installs one when none is found: Playwright's own
download first, then, where that download is impossible (an offline machine) and Debian's
`apt-get` is there as root, Debian's `chromium`. When every way fails it stops with one line
that says how to get a browser.

`python -m launcher.browser` prints the path found (or installed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

ON_PATH = ("chromium", "chromium-browser", "google-chrome")
HOW_TO_GET_ONE = (
    "no Chromium for the browser tests: install one (Debian/Ubuntu: `sudo apt-get install "
    "chromium`; elsewhere `.venv/bin/python -m playwright install chromium`) or name one "
    "with CHROMIUM=/path/to/chrome"
)


def _runnable(path: str | None) -> str | None:
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    return None


def playwright_chromium() -> str | None:
    """The browser Playwright downloaded for itself (`playwright install chromium`), if any."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    try:
        with sync_playwright() as playwright:
            return _runnable(playwright.chromium.executable_path)
    except Exception:  # a broken driver is no browser; the next way is tried
        return None


def chromium_find() -> str | None:
    """The first runnable Chromium: `CHROMIUM`, Playwright's own, then PATH; None if none."""
    named = os.environ.get("CHROMIUM")
    if named:
        # a named browser is the one wanted: a wrong name is an error, not a reason to look on
        if not _runnable(named):
            raise SystemExit(f"CHROMIUM={named} is not an executable file")
        return named
    found = playwright_chromium()
    if found:
        return found
    for name in ON_PATH:
        found = _runnable(shutil.which(name))
        if found:
            return found
    return None


def _playwright_install() -> bool:
    command = [sys.executable, "-m", "playwright", "install", "chromium"]
    print("make test: no Chromium found; trying `playwright install chromium`", flush=True)
    return subprocess.run(command, check=False).returncode == 0


def _apt_install() -> bool:
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return False
    print("make test: Playwright's download failed; installing Debian's chromium", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "chromium"],
    ):
        done = subprocess.run(command, env=env, check=False, stdout=subprocess.DEVNULL)
        if done.returncode != 0:
            return False
    return True


def chromium_ensure() -> str:
    """A runnable Chromium, installed if none is found; SystemExit with one line if none can
    be had."""
    found = chromium_find()
    if found:
        return found
    for install in (_playwright_install, _apt_install):
        if install():
            found = chromium_find()
            if found:
                return found
    raise SystemExit(HOW_TO_GET_ONE)


if __name__ == "__main__":
    print(chromium_ensure())
