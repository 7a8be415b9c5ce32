"""`opsboard-agent run --metrics-port`: a running agent's own /metrics, scraped over HTTP and
read with prometheus_client's parser: batches delivered into the live stack, and against a
server that is away, the spool's depth and the retries."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from launcher.procs import free_port, wait_until
from tests.agent.conftest import REPO, closed_port_url
from tests.metrics.scrape import parse, value

pytestmark = [pytest.mark.timeout(90)]


@contextmanager
def running_agent(server: str, secret: str, tmp_path: Path, port: int) -> Iterator[str]:
    token = tmp_path / "token"
    token.write_text(secret)
    command = [
        *(sys.executable, "-m", "opsboard_agent", "run", "--server", server),
        *("--token-file", str(token), "--node", "node-metrics", "--no-gpu"),
        *("--interval", "0.3", "--batch-seconds", "0.9", "--spool-dir", str(tmp_path / "spool")),
        *("--metrics-port", str(port)),
    ]
    agent = subprocess.Popen(
        command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE
    )
    try:
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        agent.send_signal(signal.SIGTERM)
        _, stderr = agent.communicate(timeout=30)
        assert agent.returncode == 0, stderr


def scrape(url: str) -> dict:
    try:
        return parse(httpx.get(url, timeout=5).text)[0]
    except httpx.TransportError:
        return {}  # not listening yet


@pytest.mark.django_db(transaction=True)
def test_a_running_agent_reports_what_it_delivered(live_stack, agent_token, tmp_path):
    with running_agent(live_stack.url, agent_token[1], tmp_path, free_port()) as url:
        wait_until(
            lambda: (
                value(scrape(url), "opsboard_agent_batches_sent_total", outcome="delivered") >= 3
            ),
            30,
            "three batches delivered",
        )
        samples = scrape(url)
        assert value(samples, "opsboard_agent_send_attempts_total") >= 3
        assert value(samples, "opsboard_agent_spool_dropped_batches_total") == 0
        assert ("opsboard_agent_spool_batches", ()) in samples
        # three ticks a batch after the first: ticks outnumber the batches delivered
        delivered = value(samples, "opsboard_agent_batches_sent_total", outcome="delivered")
        assert value(samples, "opsboard_agent_ticks_total") >= 2 * delivered
        assert ("opsboard_agent_gathered_records", ()) in samples


def test_an_agent_whose_server_is_away_shows_its_spool_growing_and_its_retries(tmp_path):
    with running_agent(closed_port_url(), "secret", tmp_path, free_port()) as url:
        wait_until(
            lambda: value(scrape(url), "opsboard_agent_spool_batches") >= 3,
            30,
            "batches waiting in the spool",
        )
        samples = scrape(url)
        assert value(samples, "opsboard_agent_send_retries_total") >= 1
        assert value(samples, "opsboard_agent_spool_bytes") > 0
        assert value(samples, "opsboard_agent_batches_sent_total", outcome="delivered") == 0


def test_the_metrics_port_binds_loopback_unless_told_otherwise():
    from opsboard_agent.cli import build_parser

    args = build_parser().parse_args(["run", "--metrics-port", "9109"])
    assert (args.metrics_port, args.metrics_addr) == (9109, "127.0.0.1")
    args = build_parser().parse_args(["run", "--metrics-addr", "0.0.0.0", "--metrics-port", "1"])
    assert args.metrics_addr == "0.0.0.0"
