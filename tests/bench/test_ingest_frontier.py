"""bench/ingest.py --frontier's load, read off the wire: the requests its pacer would send
for a span of the run (`python -m bench.ingest_frontier requests`), checked against the
contract and a 16,384-rank run's shape. Benchmarks and tests share no code (pyproject's
import contract), so the bench runs as a process, as tests/test_load_locustfile.py does."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter

from apps.clusters.models import AgentToken
from apps.ingest.validation import batch_validate
from launcher.procs import ROOT

RANKS, GPUS, NODES = 16_384, 8, 2_048


def wire_requests(tmp_path, *args: str) -> list[tuple[int, bool, dict]]:
    """(the node whose token it carries, gzipped, the batch) of each request."""
    out = tmp_path / "requests.bin"
    subprocess.run(
        [sys.executable, "-m", "bench.ingest_frontier", "requests", str(out), *args],
        cwd=ROOT, check=True, timeout=120,
    )  # fmt: skip
    data, requests, offset = out.read_bytes(), [], 0
    while offset < len(data):
        size = int.from_bytes(data[offset : offset + 4], "big")
        head, _, body = data[offset + 4 : offset + 4 + size].partition(b"\r\n\r\n")
        offset += 4 + size
        headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
        assert int(headers["Content-Length"]) == len(body)
        gzipped = headers.get("Content-Encoding") == "gzip"
        batch_body = gzip.decompress(body) if gzipped else body
        assert batch_validate(batch_body)  # a batch the server accepts
        node = int(headers["Authorization"].removeprefix("Bearer secret-"))
        requests.append((node, gzipped, json.loads(batch_body)))
    return requests


def test_it_posts_a_report_of_every_rank_each_second_with_its_node_s_token(tmp_path):
    requests = wire_requests(tmp_path, "--start", "0", "--end", "1")
    reporters = [(node, batch) for node, _, batch in requests if "steps" in batch]
    ranks = [step["rank"] for _, batch in reporters for step in batch["steps"]]
    assert sorted(ranks) == list(range(RANKS))  # one report per rank, one POST each
    assert len(reporters) == RANKS
    for node, batch in reporters:
        token = AgentToken(nodes=[f"fn-{node:04d}"])  # as `issue_token --node` makes it
        neighbour = AgentToken(nodes=[f"fn-{(node + 1) % NODES:04d}"])
        assert token.acts_for(batch["node"]) and not neighbour.acts_for(batch["node"])
        assert all(step["rank"] // GPUS == node for step in batch["steps"])
        assert batch["run"] == "frontier-run" and len(batch["samples"]) == 2
    # the second's node ticks: 2,048 nodes every 10 s, about 205 in any second
    assert 204 <= len(requests) - RANKS <= 205


def test_it_sends_every_node_s_telemetry_once_an_interval(tmp_path):
    requests = wire_requests(tmp_path, "--ranks", "512", "--start", "0", "--end", "10")
    ticks = [(node, gzipped, batch) for node, gzipped, batch in requests if "steps" not in batch]
    assert sorted(node for node, _, _ in ticks) == list(range(64))  # each once, own token
    for node, gzipped, batch in ticks:
        assert batch["node"] == f"fn-{node:04d}" and gzipped  # as the Sender: over 2 KiB
        series = Counter((s["metric"], s.get("gpu")) for s in batch["samples"])
        assert len(series) == 106 and set(series.values()) == {1}
    assert len(requests) - len(ticks) == 512 * 10


def test_it_can_post_a_node_s_ranks_in_one_batch(tmp_path):
    requests = wire_requests(tmp_path, "--post-by", "node", "--start", "0", "--end", "1")
    reporters = [(node, batch) for node, _, batch in requests if "steps" in batch]
    assert len(reporters) == NODES
    for node, batch in reporters:
        assert [s["rank"] for s in batch["steps"]] == list(range(node * GPUS, (node + 1) * GPUS))
        assert batch["node"] == f"fn-{node:04d}"
