"""The mix of a frontier run for bench/ingest_frontier.py: what a 16,384-rank run on 2,048
nodes × 8 GPUs posts, built as the agents build it (opsboard_agent.shipper, .sender).

A training reporter's flush is a batch of its own: the node's name, the run, the rank's step
report(s) since the last flush and the two samples of its own every flush adds. A node
agent's tick is one point of each of its 106 series (12 GPU metrics × 8 GPUs, 7 host, 3 of
its own) with its node_info. A body from 2 KiB on goes gzipped (level 1), as the Sender.
"""

from __future__ import annotations

import gzip
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson

from opsboard_agent.sender import GZIP_MIN_BYTES

CLUSTER, RUN, STEP0 = "frontier", "frontier-run", 1000
PHI = 0.6180339887498949  # spreads a node's ranks over the second, as their own timers do
REPORTER, AGENT = 0, 1
GPU_METRICS = (
    "gpu.util", "gpu.mem_used_bytes", "gpu.mem_total_bytes", "gpu.temp_c", "gpu.power_w",
    "gpu.power_limit_w", "gpu.sm_clock_mhz", "gpu.throttle_reasons", "gpu.ecc_corrected",
    "gpu.ecc_uncorrected", "gpu.nvlink_tx_bytes_per_s", "gpu.nvlink_rx_bytes_per_s",
)  # fmt: skip
HOST_METRICS = (
    "host.cpu_util", "host.mem_used_bytes", "host.mem_total_bytes", "host.net_rx_bytes_per_s",
    "host.net_tx_bytes_per_s", "host.disk_read_bytes_per_s", "host.disk_write_bytes_per_s",
)  # fmt: skip
AGENT_METRICS = ("agent.collector_errors", "agent.spool_dropped_batches", "agent.rejected_batches")
REPORTER_METRICS = ("agent.spool_dropped_batches", "agent.rejected_batches")  # Shipper's own


def node_name(node: int) -> str:
    return f"fn-{node:04d}"


@dataclass(frozen=True)
class Mix:
    """What the fleet sends; `post_by` "rank" (a POST a rank, as today) or "node"."""

    ranks: int = 16_384
    gpus: int = 8
    interval: int = 10  # the node agent's tick, s
    post_by: str = "rank"

    @property
    def nodes(self) -> int:
        return self.ranks // self.gpus

    @property
    def steps_per_post(self) -> int:
        return 1 if self.post_by == "rank" else self.gpus

    @property
    def tick_samples(self) -> int:
        return self.gpus * len(GPU_METRICS) + len(HOST_METRICS) + len(AGENT_METRICS)

    def offered(self) -> dict[str, float]:
        """Per second: step reports, samples, POSTs."""
        posts, ticks = self.ranks / self.steps_per_post, self.nodes / self.interval
        samples = posts * len(REPORTER_METRICS) + ticks * self.tick_samples
        return {"reports": float(self.ranks), "samples": samples, "posts": posts + ticks}

    def schedule(self) -> list[tuple[float, int, int]]:
        """A period (`interval` s) of posts by due time: (offset s, kind, rank or node)."""
        entries = [
            (second + (who * PHI) % 1.0, REPORTER, who)
            for second in range(self.interval)
            for who in range(self.ranks // self.steps_per_post)
        ]
        entries += [((n + 0.5) * self.interval / self.nodes, AGENT, n) for n in range(self.nodes)]
        return sorted(entries)

    def node_of(self, kind: int, who: int) -> int:
        return who // self.gpus if kind == REPORTER and self.post_by == "rank" else who

    def reporter_batch(self, who: int, second: int, ts: float, instance: str) -> dict:
        """The batch a reporter's Shipper builds at its flush of `second`: batch_id
        node/instance/count, the node, its own samples, the step report(s), the run."""
        node = self.node_of(REPORTER, who)
        if self.post_by == "rank":
            ranks, instance = [who], f"{instance}-r{who}"
        else:
            ranks, instance = list(range(who * self.gpus, (who + 1) * self.gpus)), f"{instance}-n"
        return {
            "batch_id": f"{node_name(node)}/{instance}/{second + 1}",
            "node": node_name(node),
            "samples": [{"ts": ts, "metric": m, "value": 0.0} for m in REPORTER_METRICS],
            "steps": [step_report(rank, STEP0 + second, ts - 0.05, self.gpus) for rank in ranks],
            "run": RUN,
        }

    def telemetry_batch(self, node: int, tick: int, ts: float, instance: str) -> dict:
        """A node agent's tick: a point of each of its 106 series, and its node_info."""
        samples: list[dict] = []
        for gpu in range(self.gpus):
            base = 90.0 + (node * 7 + gpu * 13 + tick) % 10
            samples += [
                {"ts": ts, "metric": m, "gpu": gpu, "value": base + index * 100}
                for index, m in enumerate(GPU_METRICS)
            ]
        samples += [{"ts": ts, "metric": m, "value": 1.5e9 + tick} for m in HOST_METRICS]
        samples += [{"ts": ts, "metric": m, "value": 0.0} for m in AGENT_METRICS]
        return {
            "batch_id": f"{node_name(node)}/{instance}-agent/{tick + 1}",
            "node": node_name(node),
            "node_info": {"gpus": self.gpus, "gpu_model": "NVIDIA H100 80GB HBM3", "cpus": 96},
            "samples": samples,
        }

    def step_rows(self, count: int) -> list[tuple]:
        """`count` reports as runs_stepreport rows (step_disk.STEP_COLUMNS), second by second."""
        base, rows = time.time() - 3600, []
        for index in range(count):
            second, rank = divmod(index, self.ranks)
            r = step_report(rank, STEP0 + second, base + second, self.gpus)
            canary = r.get("canary") or {}
            rows.append((
                1, rank // self.gpus + 1, datetime.fromtimestamp(r["ts"], tz=UTC), rank,
                r["step"], r["step_time"], r["data_time"], r["h2d_time"], r["compute_time"],
                r["comm_wait"], r["tokens"], r["loss"], r.get("grad_checksum"),
                r.get("param_checksum"), canary.get("norm"), canary.get("proj"), r["shard"],
                r["gpu"],
            ))  # fmt: skip
        return rows


def step_report(rank: int, step: int, ts: float, gpus: int = 8) -> dict:
    """A healthy rank's report: phases that add up; every 100th step checksums and a canary
    that agree across ranks (a run whose ranks disagreed would raise sdc alerts)."""
    jitter = ((rank * 2654435761 + step * 40503) % 1000) / 1e4  # 0–0.1 s, deterministic
    record = {
        "ts": ts, "rank": rank, "step": step, "step_time": 1.0, "data_time": 0.05,
        "h2d_time": 0.01, "compute_time": 0.55 + jitter, "comm_wait": 0.39 - jitter,
        "tokens": 4096, "loss": 2.0 + 8.0 / (1 + step / 400), "shard": f"tp{rank % gpus}",
        "gpu": rank % gpus,
    }  # fmt: skip
    if step % 100 == 0:
        digest = f"{(step * 0x9E3779B97F4A7C15) % 2**64:016x}" * 4
        record["grad_checksum"], record["param_checksum"] = digest, digest[::-1]
        record["canary"] = {"norm": 3.5, "proj": [0.125, -0.872, 0.0431, 1.502]}
    return record


def encode(batch: dict) -> tuple[bytes, bool]:
    """The body as the agent's Sender posts it, and whether it is gzipped (level 1, 2 KiB on)."""
    body = orjson.dumps(batch)
    if len(body) >= GZIP_MIN_BYTES:
        return gzip.compress(body, compresslevel=1), True
    return body, False
