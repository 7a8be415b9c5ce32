"""A real Prometheus (Debian's `prometheus`, 2.42 on bookworm) scrapes the vendored
node_exporter and dcgm-exporter captures from a loopback server and remote-writes to the
live stack: every exposed series is stored on its node under its job, DCGM fields as core
metrics under their GPU, counters as rates, one value per timestamp; then Prometheus
scrapes Opsboard's own /metrics and sees the remote-write counters move.

CI installs Prometheus (.ci/run) and fails if it is missing; elsewhere the test is skipped
with the apt-get line that installs it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest

from apps.clusters.services import token_issue
from apps.ingest.models import InboxBatch
from launcher.procs import free_port, http_ok, wait_until
from opsboard_agent.collectors.scrape import TargetReader
from opsboard_agent.targets import ScrapeTarget
from tests.agent.conftest import FIXTURES, REPO, serve_file
from tests.agent.conftest import loopback as loopback  # a fixture, used by name
from tests.agent.test_real_exporters import check_one_value_per_timestamp, start, stop
from tests.ingest.test_remote_write import stored
from tests.peers import peer_binaries

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack, pytest.mark.timeout(240)]

NODE = "rw-node-1"
INSTALL = "apt-get install prometheus"
# Series Prometheus adds to every target (its scrape's own health), stored like the rest
SCRAPE_SERIES = {
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
}

CONFIG = """
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: node
    metrics_path: /node
    static_configs: [{{targets: ["{exporters}"]}}]
    relabel_configs: [{{target_label: instance, replacement: "{node}:9100"}}]
  - job_name: dcgm
    metrics_path: /dcgm
    static_configs: [{{targets: ["{exporters}"]}}]
    relabel_configs: [{{target_label: instance, replacement: "{node}:9400"}}]
  - job_name: opsboard
    metrics_path: /metrics
    authorization: {{credentials: test-scrape-token}}
    static_configs: [{{targets: ["{opsboard}"]}}]
  - job_name: agent
    static_configs: [{{targets: ["127.0.0.1:{agent_port}"]}}]
remote_write:
  - url: {opsboard_url}/api/v1/write
    authorization: {{credentials_file: {token_file}}}
    write_relabel_configs:  # Opsboard's and its agent's own series stay in the Prometheus
      - {{source_labels: [job], regex: "opsboard|agent", action: drop}}
    queue_config: {{batch_send_deadline: 1s, min_backoff: 100ms, max_backoff: 1s,
                   retry_on_http_429: true}}
    metadata_config: {{send_interval: 1s}}  # the families' types, soon after the start
"""


@pytest.fixture
def captures(loopback, tmp_path):
    """The loopback server serving node_exporter's and dcgm-exporter's captures."""
    dcgm = (FIXTURES / "dcgm-exporter" / "README-quickstart-metrics-excerpt.txt").read_text()
    dcgm_file = tmp_path / "dcgm.txt"  # the README's "..." elisions are not exposition
    dcgm_file.write_text("\n".join(line for line in dcgm.splitlines() if line != "...") + "\n")
    # node_exporter's end-to-end capture holds one label value with a control character
    # (its DMI product version, \x1c, on purpose), which str.splitlines() in the expectation's
    # line parser (tests.agent.test_real_exporters) would cut in two: that line is left out
    node = (FIXTURES / "node_exporter" / "e2e-output.txt").read_bytes().split(b"\n")
    node_file = tmp_path / "node.txt"
    node_file.write_bytes(b"\n".join(line for line in node if b"\x1c" not in line))
    text = "text/plain; version=0.0.4"
    loopback.routes["/node"] = serve_file(node_file, text)
    loopback.routes["/dcgm"] = serve_file(dcgm_file, text)
    return loopback, {"node": node_file, "dcgm": dcgm_file}


def prometheus_query(url: str, query: str) -> list[dict]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": query}, timeout=10).json()
    return answer["data"]["result"]


def test_a_real_prometheus_writes_both_exporters_onto_their_node(
    live_stack, agent_token, captures, tmp_path
):
    [binary] = peer_binaries("prometheus", install=INSTALL)
    token, secret = agent_token
    server, files = captures
    (tmp_path / "token").write_text(secret)
    port, agent_port = free_port(), free_port()
    agent = start_agent(live_stack.url, agent_port, tmp_path)
    (tmp_path / "prometheus.yml").write_text(
        CONFIG.format(
            exporters=server.url.removeprefix("http://"),
            node=NODE,
            opsboard=live_stack.url.removeprefix("http://"),
            opsboard_url=live_stack.url,
            token_file=tmp_path / "token",
            agent_port=agent_port,
        )
    )
    prometheus = start(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        tmp_path / "prometheus.log",
    )
    prometheus_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(f"{prometheus_url}/-/ready"), 60, "Prometheus to start")
        expected = {job: expected_names(job, files[job]) for job in files}
        wait_until(
            lambda: all(names <= stored_names(token) for names in expected.values()),
            90,
            "every exposed series stored",
            state=lambda: missing(expected, token, tmp_path / "prometheus.log"),
        )
        # Prometheus scrapes Opsboard too: its remote-write counters move as it writes
        accepted = 'opsboard_remote_write_samples_total{outcome="accepted"}'
        wait_until(lambda: prometheus_query(prometheus_url, accepted), 30, "the counter scraped")
        first = float(prometheus_query(prometheus_url, accepted)[0]["value"][1])
        wait_until(
            lambda: float(prometheus_query(prometheus_url, accepted)[0]["value"][1]) > first,
            30,
            "the accepted samples counter to grow",
        )
        backlog = prometheus_query(prometheus_url, "opsboard_inbox_backlog_batches")
        assert backlog and float(backlog[0]["value"][1]) >= 0
        # the agent's own /metrics: the batches it sent grow as it sends one a second
        sent = "opsboard_agent_batches_sent_total"
        wait_until(lambda: prometheus_query(prometheus_url, f"{sent} > 0"), 30, "agent scraped")
        before = float(prometheus_query(prometheus_url, sent)[0]["value"][1])
        wait_until(
            lambda: float(prometheus_query(prometheus_url, sent)[0]["value"][1]) > before,
            30,
            "the agent's sent batches to grow",
        )
        # the detectors ran for the remote-written cluster, within their period
        age = f'opsboard_detector_pass_age_seconds{{cluster="{token.cluster.name}"}}'
        wait_until(lambda: prometheus_query(prometheus_url, f"{age} < 30"), 60, "a fresh pass")
    finally:
        stop(prometheus)
        stop(agent)
    log = (tmp_path / "prometheus.log").read_text()
    assert "non-recoverable" not in log and "Failed to send" not in log, log[-3000:]
    wait_until(
        lambda: not InboxBatch.objects.filter(token=token, processed_at__isnull=True).exists(),
        60,
        "the worker to store every batch",
    )
    assert not InboxBatch.objects.filter(token=token, quarantined_at__isnull=False).exists()

    points = stored(token.cluster_id)
    assert {node for node, _, _ in points} == {NODE}
    check_one_value_per_timestamp(points)
    names = {metric for _, metric, _ in points}
    # the agent's names for the same captures: nothing missing, nothing more
    wanted = set().union(*expected.values())
    assert names == wanted, (sorted(wanted - names)[:10], sorted(names - wanted)[:10])
    # DCGM fields that are core metrics: under GPU 0, with the exporter's value
    assert {v for _, v in points[(NODE, "gpu.sm_clock_mhz", 0)]} == {139.0}
    rates = [v for (_, metric, _), series in points.items() if metric.endswith(".rate")
             for _, v in series]  # fmt: skip
    assert len(rates) > 100 and set(rates) == {0.0}  # a capture's counters stand still
    listing = httpx.get(
        f"{live_stack.url}/api/v1/nodes/{NODE}/series",
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    )
    assert listing.status_code == 200, listing.text
    sources = {s["source"]: s["series"] for s in listing.json()["sources"]}
    assert sources["node"] == len({n for n in names if n.startswith("node:")})


def start_agent(url: str, metrics_port: int, tmp_path: Path):
    """The agent, with its /metrics on `metrics_port`, posting as a node of a cluster of its
    own (so that the remote-written cluster holds the Prometheus's node alone)."""
    _, secret = token_issue(cluster_name=f"agent-{metrics_port}", name="agent")
    (tmp_path / "agent-token").write_text(secret)
    command = [
        sys.executable, "-m", "opsboard_agent", "run", "--server", url,
        "--token-file", str(tmp_path / "agent-token"), "--node", "agent-node", "--no-gpu",
        "--interval", "1", "--metrics-port", str(metrics_port),
        "--spool-dir", str(tmp_path / "spool"), "--log-level", "WARNING",
    ]  # fmt: skip
    return start(command, tmp_path / "agent.log", env={**os.environ, "PYTHONPATH": str(REPO)})


def expected_names(job: str, path: Path) -> set[str]:
    """The names the agent stores for the capture scraped as target `job` (its second
    scrape: counters have rates by then), and Prometheus's own series of the scrape."""
    reader = TargetReader(ScrapeTarget(job, "http://127.0.0.1/capture"))
    text = path.read_text()
    reader.read(text, "text/plain; version=0.0.4", 1.0)
    second = reader.read(text, "text/plain; version=0.0.4", 2.0)
    return {s["metric"] for s in second.samples()} | scrape_names(job)


def scrape_names(job: str) -> set[str]:
    return {f"{job}:{series}" for series in SCRAPE_SERIES}


def stored_names(token) -> set[str]:
    return {metric for _, metric, _ in stored(token.cluster_id)}


def missing(expected: dict[str, set[str]], token, log: Path) -> str:
    have = stored_names(token)
    gone = {job: sorted(names - have)[:8] for job, names in expected.items()}
    return f"{len(have)} stored; missing {gone}; Prometheus: {log.read_text()[-1500:]}"
