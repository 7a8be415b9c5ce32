"""`make test` in a lone copy of the checkout on the embedded default stops every embedded
server that it started, whichever step started it (collectstatic starts both before pytest
does), and leaves running those it found running: checked from the outside, by scanning
/proc for any process of that copy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.leftovers import processes_under
from launcher.procs import ROOT

pytestmark = pytest.mark.timeout(600)

VENV = Path(sys.executable).parent.parent
# Small, and on the database: pytest makes its test database on the embedded Postgres
SUBSET = "tests/test_db_nice.py -k renices -q -p no:cacheprovider"


def lone_copy(destination: Path) -> Path:
    """The checkout's files as a clone would hold them (tracked, and new files git does not
    ignore: the change under test), without its var/, venv or build outputs."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout  # fmt: skip
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
            target.chmod(source.stat().st_mode & 0o777)
    return destination


def embedded_env() -> dict[str, str]:
    """This environment less everything that points at servers: the embedded default."""
    dropped = ("DATABASE_URL", "REDIS_URL", "OPSBOARD_REDIS_PREFIX", "OPSBOARD_VAR_DIR")
    return {key: value for key, value in os.environ.items() if key not in dropped}


def make_test(clone: Path, log: Path) -> None:
    # this session's venv, as it is: not remade for the copy (`-o`: take it as up to date)
    venv = [f"VENV={VENV}", "-o", f"{VENV}/.installed", "-o", f"{VENV}/.installed-torch"]
    with open(log, "ab") as out:
        done = subprocess.run(
            ["make", "-C", str(clone), *venv, "test", f"PYTEST_ARGS={SUBSET}"],
            env=embedded_env(), stdout=out, stderr=subprocess.STDOUT, timeout=480,
        )  # fmt: skip
    assert done.returncode == 0, log.read_text()[-3000:]
    assert " passed" in log.read_text()


def embedded_servers(clone: Path, action: str) -> str:
    """Run `opsboard.embedded.<action>` in the copy, as another process of it would."""
    code = f"from opsboard import embedded; print(sorted(embedded.{action}() or ()))"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=clone, env=embedded_env(),
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout.strip().splitlines()[-1]  # fmt: skip


def test_make_test_leaves_no_server_it_started_and_keeps_those_it_found(tmp_path):
    clone = lone_copy(tmp_path / "clone")
    log = tmp_path / "make-test.log"

    make_test(clone, log)
    assert (clone / "var" / "pgdata").is_dir(), "the run used the copy's embedded Postgres"
    assert processes_under(clone) == []

    # servers already running (a developer's `make run`): started, then left by their starter
    embedded_servers(clone, "database_url")
    embedded_servers(clone, "redis_url")
    assert embedded_servers(clone, "servers_running") == "['postgres', 'redis']"
    try:
        make_test(clone, log)
        assert embedded_servers(clone, "servers_running") == "['postgres', 'redis']"
    finally:
        embedded_servers(clone, "stop_all")
    assert processes_under(clone) == []
