"""A newcomer's first ten minutes: `make demo` without torch, quiet logs, bounded demo data
(short retention, a small WAL), an agent whose --help says where its token comes from, a
favicon."""

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.procs import ROOT
from launcher.stack import (
    DEMO_RETENTION_DAYS,
    processes,
    simulator_command,
    stack_environment,
)

BLOCK_TORCH = """
import runpy, sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError(f"the demo imported {name}")

sys.meta_path.insert(0, NoTorch())
import launcher.stack, opsboard_agent.cli
sys.argv = ["opsboard-sim", "--dry-run", "--nodes", "1", "--gpus", "2", "--duration", "30",
            "--fault", "straggler:rank=1,at=5"]
runpy.run_module("opsboard_agent.sim", run_name="__main__")
"""


def make_dry_run(tmp_path: Path, target: str) -> str:
    """What `make TARGET` would run in a fresh clone (no virtual environment yet)."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    done = subprocess.run(
        ["make", "-n", target], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    return done.stdout


def test_make_demo_installs_no_torch_and_make_test_does(tmp_path):
    demo = make_dry_run(tmp_path, "demo")
    assert "launcher.stack demo" in demo and "pip install" in demo
    assert "torch" not in demo
    test = make_dry_run(tmp_path, "test")
    assert "torch==" in test
    # torch before the suite's runner (launcher.testrun, which runs pytest)
    assert test.index("torch==") < test.index("-m launcher.testrun")
    # the CPU build: a wheel the machine keeps, else PyTorch's CPU index on Linux
    assert "--no-index --no-deps 'torch==" in test
    assert "--index-url https://download.pytorch.org/whl/cpu 'torch==" in test


def test_the_demo_and_its_simulator_import_no_torch():
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert '"dry_run": true' in done.stdout


@pytest.fixture
def demo_environment(monkeypatch):
    for name in ("LOG_LEVEL", *DEMO_RETENTION_DAYS):
        monkeypatch.delenv(name, raising=False)
    environment, _ = stack_environment("demo")
    return environment


def test_the_demo_runs_every_process_at_warning_level(demo_environment):
    args = argparse.Namespace(
        command="run", host="127.0.0.1", port=1, ws_port=2, web_workers=1, worker_concurrency=1
    )
    commands = processes(demo_environment, args)  # "run": no demo token issued here
    commands["simulator"] = simulator_command(
        server="http://127.0.0.1:1", token_file=Path("token"), spool_dir=Path("spool")
    )
    assert demo_environment["LOG_LEVEL"] == "WARNING"  # Django's root logger in each child
    for name, command in commands.items():
        assert "INFO" not in [part.upper() for part in command], name
    for name in ("worker", "periodic", "beat"):
        command = commands[name]
        assert command[command.index("--loglevel") + 1] == "WARNING"


def test_the_demo_keeps_its_history_for_hours_and_run_keeps_the_defaults(demo_environment):
    retention = {
        name: float(value)
        for name, value in demo_environment.items()
        if name.startswith("HISTORY_") and name.endswith("_RETENTION_DAYS")
    }
    assert len(retention) == 5 and all(0 < days <= 1 for days in retention.values())
    assert retention["HISTORY_RAW_RETENTION_DAYS"] * 24 <= 6
    assert "HISTORY_RAW_RETENTION_DAYS" not in stack_environment("run")[0]


def test_agent_run_help_says_how_to_get_a_token_and_where_the_spool_is(tmp_path):
    environment = {**os.environ, "HOME": str(tmp_path), "COLUMNS": "100"}
    environment.pop("OPSBOARD_SPOOL_DIR", None)
    done = subprocess.run(
        [sys.executable, "-m", "opsboard_agent", "run", "--help"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "manage.py issue_token CLUSTER" in done.stdout
    assert f"{tmp_path}/.local/state/opsboard-agent/spool" in done.stdout


@pytest.mark.django_db
def test_favicon_ico_leads_to_an_icon(client):
    response = client.get("/favicon.ico", follow=True)
    assert response.status_code == 200
    assert response.redirect_chain and response.redirect_chain[0][1] in (301, 302)
    assert response["Content-Type"].startswith("image/svg+xml")
    assert b"<svg" in b"".join(response.streaming_content)


WAL_PROBE = """
import psycopg
from opsboard.embedded import WAL_SETTINGS, database_url, stop_all
try:
    with psycopg.connect(database_url()) as conn:
        shown = {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in WAL_SETTINGS}
    print(shown == WAL_SETTINGS, shown)
finally:
    stop_all()
"""


def test_the_embedded_postgres_keeps_its_wal_small(tmp_path):
    environment = {
        **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")},
        "OPSBOARD_VAR_DIR": str(tmp_path / "var"),
    }
    done = subprocess.run(
        [sys.executable, "-c", WAL_PROBE],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("True"), done.stdout
