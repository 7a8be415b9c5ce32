"""`make test`'s body: a browser for the page tests, the static files, the suite; then the
embedded servers that this invocation started are stopped.

`python -m launcher.testrun [pytest arguments]` exits with pytest's status. On the embedded
default (no DATABASE_URL / REDIS_URL) any step may start the embedded Postgres and Redis under
the var dir (collectstatic imports the settings, which start both, before pytest runs): the
servers running before are noted, and every one running after that was not running before is
stopped, whichever step started it, even when the run is interrupted. Servers that were
already running (a developer's `make run`) are left alone.
"""

from __future__ import annotations

import os
import subprocess
import sys

from launcher.browser import chromium_ensure
from launcher.procs import ROOT
from opsboard import embedded

# Tests serve plain HTTP on loopback: no HTTPS redirect or secure-only cookies there.
PLAIN_HTTP = {
    "SECURE_SSL_REDIRECT": "false",
    "SESSION_COOKIE_SECURE": "false",
    "CSRF_COOKIE_SECURE": "false",
}


def step_run(command: list[str], env: dict[str, str]) -> int:
    """Run one step to its end. A Ctrl-C reaches the step too (one process group): wait for
    it to wind down its own children rather than kill it, as subprocess.run would."""
    child = subprocess.Popen(command, cwd=ROOT, env=env)
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:
            continue


def suite_run(pytest_args: list[str]) -> int:
    env = {**os.environ, **PLAIN_HTTP, "CHROMIUM": chromium_ensure()}
    steps = [
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        [sys.executable, "-m", "pytest", *pytest_args],
    ]
    for step in steps:
        status = step_run(step, env)
        if status != 0:
            return status
    return 0


def main(pytest_args: list[str]) -> int:
    os.chdir(ROOT)  # the var dir is ./var unless OPSBOARD_VAR_DIR says otherwise
    found_running = embedded.servers_running()
    try:
        return suite_run(pytest_args)
    finally:
        embedded.stop(embedded.servers_running() - found_running)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
