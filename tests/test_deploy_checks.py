"""`manage.py check --deploy` is clean with DEBUG off and production settings."""

import os
import secrets
import subprocess
import sys

import pytest

from launcher.procs import ROOT


# the ingest pool's role runs with the middleware of a bearer-token API only (settings)
@pytest.mark.parametrize("role", ["", "ingest"])
def test_check_deploy_is_clean_with_debug_off(role):
    env = {
        **os.environ,
        "OPSBOARD_ROLE": role,
        "DEBUG": "false",
        "SECRET_KEY": secrets.token_urlsafe(64),
        "ALLOWED_HOSTS": "opsboard.example.com",
        "CSRF_TRUSTED_ORIGINS": "https://opsboard.example.com",
    }
    for name in ("SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout
