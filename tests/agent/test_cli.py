"""`opsboard-agent run` as a process: configuration, stderr logging, SIGTERM."""

import json
import os
import signal
import subprocess
import sys
import time

from opsboard_agent.cli import build_parser
from tests.agent.conftest import REPO, closed_port_url


def test_options_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("OPSBOARD_SERVER", "http://s")
    monkeypatch.setenv("OPSBOARD_TOKEN_FILE", "/t")
    monkeypatch.setenv("OPSBOARD_NODE", "node-9")
    monkeypatch.setenv("OPSBOARD_SCRAPE", "http://a/metrics,http://b/metrics")
    monkeypatch.setenv("OPSBOARD_INTERVAL", "2.5")
    monkeypatch.setenv("OPSBOARD_BATCH_SECONDS", "5")
    args = build_parser().parse_args(["run", "--node", "node-10"])
    assert (args.server, args.token_file, args.node, args.interval, args.batch_seconds) == (
        "http://s",
        "/t",
        "node-10",
        2.5,
        5.0,
    )
    assert args.scrape == ["http://a/metrics", "http://b/metrics"]


def test_it_exits_cleanly_on_sigterm_and_keeps_what_it_could_not_send(tmp_path):
    token = tmp_path / "token"
    token.write_text("x")
    spool = tmp_path / "spool"
    command = [
        sys.executable,
        "-m",
        "opsboard_agent",
        "run",
        "--server",
        closed_port_url(),
        "--token-file",
        str(token),
        "--node",
        "node-01",
        "--interval",
        "0.2",
        "--spool-dir",
        str(spool),
    ]
    agent = subprocess.Popen(
        command,
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    time.sleep(2)
    agent.send_signal(signal.SIGTERM)
    _, stderr = agent.communicate(timeout=30)
    assert agent.returncode == 0, stderr
    assert "GPU collector unavailable" in stderr and "received SIGTERM" in stderr
    batches = [json.loads(p.read_bytes()) for p in sorted(spool.glob("*.batch"))]
    # By default ticks are gathered for 10 s: the first tick went alone, SIGTERM spooled the
    # rest as one batch.
    ticks = [
        [s["ts"] for s in b["samples"] if s["metric"] == "agent.collector_errors"] for b in batches
    ]
    assert [len(t) for t in ticks[:1]] == [1] and len(ticks) == 2 and len(ticks[1]) >= 4
    assert f"stopped after {sum(map(len, ticks))} ticks; 2 batches left" in stderr
    assert len({b["batch_id"] for b in batches}) == len(batches)
    assert all(b["node"] == "node-01" and b["samples"] for b in batches)


def test_batch_seconds_is_bounded(tmp_path):
    for value in ("-1", "61", "nan", "ten"):
        result = subprocess.run(
            [sys.executable, "-m", "opsboard_agent", "run", "--batch-seconds", value],
            cwd=REPO,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert result.returncode == 2 and "seconds from 0 to 60" in result.stderr, value
    assert build_parser().parse_args(["run"]).batch_seconds == 10.0
    assert build_parser().parse_args(["run", "--batch-seconds", "0"]).batch_seconds == 0.0


def test_it_refuses_to_start_without_a_server(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "opsboard_agent", "run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("OPSBOARD_")},
    )
    assert result.returncode == 2 and "--server" in result.stderr


def test_the_start_up_log_counts_only_the_collectors_that_run(tmp_path):
    token = tmp_path / "token"
    token.write_text("x")
    agent = subprocess.Popen(
        [
            *(sys.executable, "-m", "opsboard_agent", "run", "--server", closed_port_url()),
            *("--token-file", str(token), "--interval", "0.2"),
            *("--spool-dir", str(tmp_path / "spool"), "--scrape", closed_port_url() + "/m"),
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    time.sleep(2)
    agent.send_signal(signal.SIGTERM)
    _, stderr = agent.communicate(timeout=30)
    # No NVIDIA driver here: the GPU collector said so and is not counted.
    assert "GPU collector unavailable" in stderr
    assert "2 collectors: host, scrape)" in stderr
    assert "scrape target scrape_" in stderr


def test_it_refuses_two_scrape_targets_of_one_name(tmp_path):
    token = tmp_path / "token"
    token.write_text("x")
    result = subprocess.run(
        [
            *(sys.executable, "-m", "opsboard_agent", "run", "--server", "http://s"),
            *("--token-file", str(token), "--spool-dir", str(tmp_path / "spool")),
            *("--scrape", "a=http://h:1/", "--scrape", "a=http://h:2/"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 2 and "two scrape targets are named 'a'" in result.stderr
