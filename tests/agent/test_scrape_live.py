"""Two real exporters' captures with overlapping names (two Prometheus servers' own
/metrics: both expose go_* and process_*), served by two loopback targets and scraped by
the real agent into the live stack: the targets' series stay apart, one value each per
timestamp, and counters arrive as rates."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from launcher.procs import wait_until
from tests.agent.conftest import FIXTURES, REPO, serve_file

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]

TEXT = "text/plain; version=0.0.4"
FIRST = FIXTURES / "prometheus" / "alltypes.237mfs.prom.txt"
SECOND = FIXTURES / "prometheus-common" / "text"


def stored(node_name: str) -> dict[tuple[str, int | None], list[list[float]]]:
    from apps.clusters.models import Node
    from apps.telemetry.selectors import metric_id_get, node_series_list, series_read

    node = Node.objects.filter(name=node_name).first()
    if node is None:
        return {}
    return {
        (metric, gpu): series_read(
            node_id=node.id,
            metric_id=metric_id_get(name=metric),
            gpu=gpu,
            start=0,
            end=time.time() + 60,
        )
        for metric, gpu in node_series_list(node_id=node.id)
    }


def test_two_targets_keep_their_series_apart(live_stack, agent_token, live_db, tmp_path, loopback):
    _, secret = agent_token
    token_file = tmp_path / "token"
    token_file.write_text(secret)
    loopback.routes["/a"] = serve_file(FIRST, TEXT)
    loopback.routes["/b"] = serve_file(SECOND, TEXT)
    port = loopback.url.rsplit(":", 1)[1]
    command = [
        *(sys.executable, "-m", "opsboard_agent", "run", "--server", live_stack.url),
        *("--token-file", str(token_file), "--node", "node-2x", "--no-gpu"),
        *("--interval", "0.5", "--spool-dir", str(tmp_path / "spool")),
        *("--scrape", f"prom={loopback.url}/a", "--scrape", f"{loopback.url}/b"),
    ]
    agent = subprocess.Popen(
        command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE
    )
    time.sleep(4)
    agent.send_signal(signal.SIGTERM)
    _, stderr = agent.communicate(timeout=30)
    assert agent.returncode == 0, stderr
    second = f"scrape_{port}"  # the unnamed target's default name

    def rates_stored() -> bool:
        series = stored("node-2x")
        return any(m.startswith(second + ":") and m.endswith(".rate") for m, _ in series)

    wait_until(rates_stored, 90, "the scraped series to be stored")
    time.sleep(2)  # the last batches
    series = stored("node-2x")
    prom = {m.partition(":")[2] for m, _ in series if m.startswith("prom:")}
    other = {m.partition(":")[2] for m, _ in series if m.startswith(second + ":")}
    # Both exposed go_goroutines; each target has its own series of it.
    assert "go_goroutines" in prom and "go_goroutines" in other
    assert len(prom & other) >= 10
    for key, points in series.items():
        stamps = [ts for ts, _ in points]
        assert len(stamps) == len(set(stamps)), f"{key} has two values at one timestamp"
    # Counters arrive as rates (these captures never change, so the rates are 0), never raw.
    rates = [key for key in series if key[0].endswith(".rate")]
    assert rates and all(v == 0.0 for key in rates for _, v in series[key])
    assert not any(m.endswith("process_cpu_seconds_total") for m, _ in series)
    # Buckets are dropped unless allow-listed.
    assert not any("_bucket.le_" in m for m, _ in series)
    assert any("_bucket" in line for line in FIRST.read_text().splitlines())
