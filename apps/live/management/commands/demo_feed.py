"""A small built-in feeder for `make demo`: a few nodes posting realistic batches through
the real HTTP API, once a second, until stopped."""

import gzip
import json
import math
import random
import signal
import time
import urllib.error
import urllib.request

from django.core.management.base import BaseCommand

from apps.clusters.services import token_issue

GPU_MEM = 80 * 2**30


class Command(BaseCommand):
    help = "Post simulated telemetry and step reports for a demo cluster to a live server."

    def add_arguments(self, parser):
        parser.add_argument("--server", default="http://127.0.0.1:8000")
        parser.add_argument("--cluster", default="demo")
        parser.add_argument("--nodes", type=int, default=4)
        parser.add_argument("--gpus", type=int, default=8)
        parser.add_argument("--run", default="demo-pretrain-1")
        parser.add_argument("--seed", type=int, default=1)

    def handle(self, *args, **options):
        _, secret = token_issue(cluster_name=options["cluster"], name="demo feeder")
        rng = random.Random(options["seed"])
        nodes = [f"node-{index:02d}" for index in range(1, options["nodes"] + 1)]
        running = True

        def stop(*_):
            nonlocal running
            running = False

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        step, sequence = 0, 0
        while running:
            tick = time.time()
            step += 1
            for node_index, node in enumerate(nodes):
                sequence += 1
                batch = _batch(rng, options, node, node_index, step, tick, sequence)
                _post(options["server"], secret, batch)
            time.sleep(max(0.0, 1.0 - (time.time() - tick)))


def _batch(rng, options, node, node_index, step, now, sequence) -> dict:
    gpus = options["gpus"]
    samples = []
    for gpu in range(gpus):
        util = min(100.0, 92 + 6 * math.sin(now / 30 + gpu) + rng.uniform(-2, 2))
        samples += [
            {"ts": now, "metric": "gpu.util", "gpu": gpu, "value": round(util, 1)},
            {
                "ts": now,
                "metric": "gpu.mem_used_bytes",
                "gpu": gpu,
                "value": int(GPU_MEM * (0.71 + 0.02 * math.sin(now / 120))),
            },
            {"ts": now, "metric": "gpu.mem_total_bytes", "gpu": gpu, "value": GPU_MEM},
            {
                "ts": now,
                "metric": "gpu.temp_c",
                "gpu": gpu,
                "value": round(64 + rng.uniform(-3, 6), 1),
            },
            {
                "ts": now,
                "metric": "gpu.power_w",
                "gpu": gpu,
                "value": round(560 + rng.uniform(-40, 60)),
            },
            {"ts": now, "metric": "gpu.power_limit_w", "gpu": gpu, "value": 700},
            {"ts": now, "metric": "gpu.sm_clock_mhz", "gpu": gpu, "value": 1980},
            {"ts": now, "metric": "gpu.throttle_reasons", "gpu": gpu, "value": 0},
        ]
    samples += [
        {"ts": now, "metric": "host.cpu_util", "value": round(35 + rng.uniform(-5, 5), 1)},
        {"ts": now, "metric": "host.net_rx_bytes_per_s", "value": 1.1e10 + rng.uniform(-1e9, 1e9)},
        {"ts": now, "metric": "host.net_tx_bytes_per_s", "value": 1.1e10 + rng.uniform(-1e9, 1e9)},
    ]
    steps = []
    for local in range(gpus):
        compute = 0.6 + rng.uniform(-0.02, 0.02)
        steps.append(
            {
                "ts": now,
                "rank": node_index * gpus + local,
                "step": step,
                "step_time": 0.82,
                "data_time": 0.04,
                "h2d_time": 0.01,
                "compute_time": round(compute, 4),
                "comm_wait": round(0.17 - (compute - 0.6), 4),
                "tokens": 65536,
                "loss": round(3.2 * math.exp(-step / 3000) + 1.6, 4),
            }
        )
    events = []
    if step % 300 == 0:
        events.append(
            {
                "ts": now,
                "kind": "checkpoint",
                "step": step,
                "tier": "local",
                "state": "completed",
                "duration": 12.0,
            }
        )
    return {
        "batch_id": f"{node}/{int(now)}/{sequence}",
        "node": node,
        "run": options["run"],
        "node_info": {"gpus": gpus, "gpu_model": "NVIDIA H100 80GB HBM3"},
        "samples": samples,
        "steps": steps,
        "events": events,
    }


def _post(server: str, secret: str, batch: dict) -> None:
    request = urllib.request.Request(
        f"{server}/api/v1/ingest",
        data=gzip.compress(json.dumps(batch).encode()),
        method="POST",
        headers={
            "Authorization": f"Bearer {secret}",
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
        },
    )
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except (urllib.error.URLError, OSError) as error:
        print(f"demo feeder: {error}", flush=True)
