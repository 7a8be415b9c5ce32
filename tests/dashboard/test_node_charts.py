"""The node page's charts and lists: throttle reasons decoded from the NVML bitmask, memory
as a share of the total, axes that do not autoscale to noise, host charts where the agent
sends host series, the runs and ranks on the node, and the GPU picker (?gpu=N)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

import pytest

from apps.clusters.models import Cluster
from apps.dashboard.charts.node import reason_label, throttle_labels
from apps.ingest.services import ClaimedBatch, batches_store
from tests.dashboard.conftest import RUN, gpu_samples, step_reports
from tests.dashboard.test_pages import json_script

pytestmark = pytest.mark.django_db

# NVML: 0x08 HW slowdown, 0x20 SW thermal slowdown
THROTTLED_MASK = 0x08 | 0x20
HOST = {
    "host.cpu_util": 37.0,
    "host.mem_used_bytes": 128e9,
    "host.mem_total_bytes": 512e9,
    "host.net_rx_bytes_per_s": 2.5e9,
    "host.net_tx_bytes_per_s": 1.5e9,
    "host.disk_read_bytes_per_s": 4e8,
    "host.disk_write_bytes_per_s": 1e8,
}


def node_store(name: str, *, host: bool, steps: int = 6) -> Cluster:
    """node-00 (4 GPUs, ranks 0-3 of RUN, reporting each rank's GPU) whose GPU 1 is throttled
    by THROTTLED_MASK; with `host`, the agent's host series too."""
    now = time.time()
    cluster = Cluster.objects.create(name=name)
    batches = []
    for step in range(steps):
        ts = now - steps + step + 1
        samples = gpu_samples(ts, 4)
        for sample in samples:
            if sample["metric"] == "gpu.throttle_reasons" and sample["gpu"] == 1:
                sample["value"] = float(THROTTLED_MASK)
        if host:
            samples += [{"ts": ts, "metric": m, "value": v} for m, v in HOST.items()]
        reports = step_reports(ts, step, range(4))
        for report in reports:
            report["gpu"] = report["rank"]
        batches.append({
            "batch_id": f"{name}-{step}", "node": "node-00", "node_info": {"gpus": 4},
            "run": RUN, "samples": samples, "steps": reports, "events": [],
        })  # fmt: skip
    received = datetime.fromtimestamp(now, UTC)
    batches_store(batches=[ClaimedBatch.of(cluster.id, received, body) for body in batches])
    return cluster


def node_page(client, cluster: Cluster, query: str = "") -> str:
    response = client.get(f"/clusters/{cluster.name}/nodes/node-00/{query}")
    assert response.status_code == 200
    return response.content.decode()


def test_nvml_bits_are_named_in_words():
    assert reason_label("SW_POWER_CAP") == "SW power cap"
    assert throttle_labels(THROTTLED_MASK) == ["HW slowdown", "SW thermal slowdown"]
    assert throttle_labels(0) == [] and throttle_labels(None) == []
    assert throttle_labels(0x200) == ["Unknown 0x200"]


def test_throttle_reasons_are_decoded_on_the_page_and_in_the_chart(client_in):
    html = node_page(client_in, node_store("alpha", host=False))
    now = re.search(r'<p class="throttle-now" id="throttle-now">(.*?)</p>', html, re.S).group(1)
    assert re.search(r'data-gpu="1" data-mask="40">GPU 1: HW slowdown, SW thermal slowdown<', now)
    assert 'data-gpu="0" data-mask="0">GPU 0: none<' in now
    figure = json_script(html, "figure-throttle")
    gpu1 = next(trace for trace in figure["data"] if trace["name"] == "GPU 1")
    assert set(gpu1["y"]) == {"HW slowdown", "SW thermal slowdown"}
    gpu0 = next(trace for trace in figure["data"] if trace["name"] == "GPU 0")
    assert set(gpu0["y"]) == {"none"}
    assert figure["layout"]["yaxis"]["categoryarray"][:4] == [
        "none", "GPU idle", "Applications clocks setting", "SW power cap"
    ]  # fmt: skip


def test_memory_is_a_share_of_the_total_with_the_bytes_in_the_hover(client_in):
    figure = json_script(node_page(client_in, node_store("alpha", host=False)), "figure-memory")
    assert figure["layout"]["yaxis"]["title"]["text"] == "% of total"
    assert figure["layout"]["yaxis"]["range"] == [0, 100]
    for trace in figure["data"]:
        assert set(trace["y"]) == {75.0}  # 60 GB of 80 GB
        assert set(trace["customdata"]) == {60e9}
        assert "of 80.0 GB" in trace["hovertemplate"]


def test_axes_have_sensible_floors(client_in):
    html = node_page(client_in, node_store("alpha", host=False))
    assert json_script(html, "figure-util")["layout"]["yaxis"]["range"] == [0, 100]
    temperature = json_script(html, "figure-temperature")["layout"]["yaxis"]
    assert temperature["autorangeoptions"]["include"][0] == 20.0
    assert json_script(html, "figure-power")["layout"]["yaxis"]["autorangeoptions"] == {
        "include": [0]
    }


def test_each_gpu_trace_names_its_gpu_for_the_highlight(client_in):
    html = node_page(client_in, node_store("alpha", host=False), "?gpu=2")
    for chart in ("util", "memory", "temperature", "power", "throttle"):
        traces = json_script(html, f"figure-{chart}")["data"]
        assert [t["meta"]["gpu"] for t in traces] == [0, 1, 2, 3], chart
    picker = re.search(r'<div class="gpu-picker".*?</div>', html, re.S).group(0)
    assert re.findall(r'data-gpu="(\d*)" aria-pressed="true"', picker) == ["2"]


def test_host_charts_are_drawn_when_the_agent_sends_host_series(client_in):
    with_host = node_page(client_in, node_store("alpha", host=True))
    cpu = json_script(with_host, "figure-host_cpu")
    assert cpu["data"][0]["y"][-1] == 37.0 and cpu["layout"]["yaxis"]["range"] == [0, 100]
    memory = json_script(with_host, "figure-host_memory")
    assert set(memory["data"][0]["y"]) == {25.0}  # 128 GB of 512 GB
    network = json_script(with_host, "figure-host_network")
    assert [t["name"] for t in network["data"]] == ["received", "sent"]
    assert network["layout"]["yaxis"]["ticksuffix"] == "B/s"
    disk = json_script(with_host, "figure-host_disk")
    assert [t["name"] for t in disk["data"]] == ["read", "written"]
    without = node_page(client_in, node_store("beta", host=False))
    assert 'data-chart="host_cpu"' not in without and 'data-chart="util"' in without


def test_the_host_chart_endpoint_answers_the_same_figure(client_in):
    cluster = node_store("alpha", host=True)
    response = client_in.get(f"/clusters/{cluster.name}/nodes/node-00/charts/host_memory.json")
    assert response.status_code == 200
    assert set(response.json()["figure"]["data"][0]["y"]) == {25.0}
    csv = client_in.get(f"/clusters/{cluster.name}/nodes/node-00/charts/throttle.csv")
    assert "GPU 1" in csv.content.decode() and "HW slowdown" in csv.content.decode()


def test_the_runs_and_ranks_on_the_node_are_listed_with_links(client_in):
    cluster = node_store("alpha", host=False)
    html = node_page(client_in, cluster)
    table = re.search(r'<table class="events" id="node-runs">.*?</table>', html, re.S).group(0)
    assert f'href="/clusters/{cluster.name}/runs/{RUN}/"' in table
    ranks = re.findall(
        r'class="rank-link" data-rank="(\d)" href="([^"]+)">rank \d \(GPU (\d)\)', table
    )
    assert [(rank, gpu) for rank, _, gpu in ranks] == [(str(r), str(r)) for r in range(4)]
    assert ranks[2][1] == f"/clusters/{cluster.name}/runs/{RUN}/ranks/2/"
