"""What the agent costs: the node agent's CPU and memory, and the reporter's per-step cost.

1. The node agent: a real `opsboard-agent run` subprocess at 1 Hz scraping two loopback
   exporters -- node_exporter's end-to-end fixture (3,027 samples) and a dcgm-exporter
   exposition of an 8-GPU node (the DCP field list, 8 GPUs, labels as dcgm-exporter sends
   them) -- and shipping to a loopback stub that answers 202. CPU % of one core and RSS are
   read with psutil over `--seconds` (default 60) after a warm-up. Budget: < 1 % of a core.
2. The training-loop reporter: four phase timers plus `step()` with its threads live, and
   the corruption checks (grad + param checksum, canary) on the example model and on a
   model of realistic size (`--params`, default 1e9, scaled down to what memory allows),
   as seconds per check and GB/s hashed. Budget: 1 % of a 100 ms step.

Run: python bench/agent_overhead.py [--seconds 60] [--params 1e9] [--skip-reporter]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from opsboard_agent.reporter import Reporter  # noqa: E402

STEP_S = 0.100
STEPS = 20_000
CHECK_EVERY = 100
FIXTURES = ROOT / "tests" / "fixtures"
NODE_FIXTURE = "node_exporter/e2e-output.txt"
DCGM_FIELDS = "dcgm-exporter/dcp-metrics-included.csv"
TEXT = "text/plain; version=0.0.4; charset=utf-8"


def fixture(relative: str) -> Path:
    """A fixture file from the repository's vendored copies (tests/fixtures/README.md)."""
    return FIXTURES / relative


def dcgm_fields() -> list[tuple[str, str, str]]:
    """(field, type, help) of dcgm-exporter's DCP counter list, as it exports them."""
    fields = []
    for line in fixture(DCGM_FIELDS).read_text().splitlines():
        parts = [p.strip() for p in line.split(",", 2)]
        if not line.startswith("#") and len(parts) == 3 and parts[1] in ("gauge", "counter"):
            fields.append((parts[0], parts[1], parts[2]))
    return fields


def dcgm_exposition(fields: list[tuple[str, str, str]], tick: int, gpus: int = 8) -> bytes:
    """What dcgm-exporter answers on an 8-GPU H100 node, values moving with `tick`."""
    out = []
    for n, (field, kind, help_text) in enumerate(fields):
        out.append(f"# HELP {field} {help_text}\n# TYPE {field} {kind}\n")
        for gpu in range(gpus):
            labels = (
                f'gpu="{gpu}",UUID="GPU-{gpu:08x}-5d2c-4e3b-9f1a-0c6b1e2d3f4{gpu}",'
                f'pci_bus_id="00000000:{0x18 + 16 * gpu:02X}:00.0",device="nvidia{gpu}",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-07",'
                f'DCGM_FI_DRIVER_VERSION="550.90.07"'
            )
            if field == "DCGM_FI_DEV_XID_ERRORS":
                value = "0"  # a healthy node
            elif kind == "counter":
                value = f"{(tick + 1) * (1000 + 37 * n + gpu)}"
            else:
                value = f"{(n * 7 + gpu * 3 + tick) % 97}.{tick % 10}"
            out.append(f"{field}{{{labels}}} {value}\n")
    return "".join(out).encode()


class Stubs:
    """Loopback exporters (`/node`, `/dcgm`) and an ingest stub answering 202 that counts
    the batches and samples it got."""

    def __init__(self) -> None:
        node = fixture(NODE_FIXTURE).read_bytes()
        fields = dcgm_fields()
        self.batches = self.samples = self.ticks = 0
        stubs = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                if self.path == "/node":
                    body = node
                else:
                    stubs.ticks += 1
                    body = dcgm_exposition(fields, stubs.ticks)
                self._answer(200, body, TEXT)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = zlib.decompress(body, 16 + zlib.MAX_WBITS)
                batch = json.loads(body)
                stubs.batches += 1
                stubs.samples += len(batch.get("samples", ()))
                reply = json.dumps({"batch_id": batch["batch_id"], "accepted": {}}).encode()
                self._answer(202, reply, "application/json")

            def _answer(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def node_agent_overhead(seconds: float, warmup: float = 5.0) -> dict[str, float]:
    """CPU % of one core and RSS of a real agent process scraping both stubs at 1 Hz."""
    stubs = Stubs()
    with tempfile.TemporaryDirectory() as scratch:
        token = Path(scratch) / "token"
        token.write_text("bench")
        command = [
            sys.executable,
            "-m",
            "opsboard_agent",
            "run",
            *("--server", stubs.url, "--token-file", str(token), "--node", "bench"),
            *("--scrape", f"node={stubs.url}/node", "--scrape", f"dcgm={stubs.url}/dcgm"),
            *("--interval", "1", "--spool-dir", str(Path(scratch) / "spool")),
            *("--no-gpu", "--log-level", "WARNING"),
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        agent = subprocess.Popen(command, cwd=ROOT, env=env)
        try:
            process = psutil.Process(agent.pid)
            time.sleep(warmup)  # imports, the first (slow) parses, the first rates
            rss = [process.memory_info().rss]
            cpu_before, wall_before = process.cpu_times(), time.monotonic()
            batches_before, samples_before = stubs.batches, stubs.samples
            while time.monotonic() - wall_before < seconds:
                time.sleep(1.0)
                rss.append(process.memory_info().rss)
            cpu_after, wall = process.cpu_times(), time.monotonic() - wall_before
        finally:
            agent.terminate()
            agent.wait(timeout=30)
            stubs.close()
    used = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    batches = stubs.batches - batches_before
    return {
        "seconds": wall,
        "cpu_percent": 100 * used / wall,
        "rss_start_mb": rss[0] / 2**20,
        "rss_end_mb": rss[-1] / 2**20,
        "rss_max_mb": max(rss) / 2**20,
        "batches": batches,
        "samples_per_batch": (stubs.samples - samples_before) / max(1, batches),
    }


def per_step_seconds(reporter: Reporter) -> float:
    phases = [reporter.phase(name) for name in ("data", "h2d", "compute", "comm")]
    started = time.perf_counter()
    for step in range(STEPS):
        for phase in phases:
            with phase:
                pass
        reporter.step(step, tokens=4096, loss=2.0)
    return (time.perf_counter() - started) / STEPS


def example_model():
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
    probe = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    return model, probe, lambda m: F.mse_loss(m(probe), probe[:, :1])


def big_model(params: float):
    """A stack of square linear layers holding about `params` parameters, gradients set."""
    import torch
    from torch import nn

    width = 4096
    layers = max(1, round(params / (width * width + width)))
    model = nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))
    probe = torch.randn(4, width, generator=torch.Generator().manual_seed(1))
    model(probe).square().mean().backward()
    return model, probe, lambda m: m(probe).square().mean()


def check_seconds(reporter: Reporter, model, loss_fn, rounds: int) -> dict[str, float]:
    timings = {"grad": 0.0, "param": 0.0, "canary": 0.0}
    for _ in range(rounds):
        for name, check in (
            ("grad", lambda: reporter.record_grad_checksum(model)),
            ("param", lambda: reporter.record_param_checksum(model)),
            ("canary", lambda: reporter.record_canary(model, loss_fn)),
        ):
            started = time.perf_counter()
            check()
            timings[name] += time.perf_counter() - started
    return {name: total / rounds for name, total in timings.items()}


def affordable_params(wanted: float) -> float:
    """The largest of wanted, wanted/2, ... whose check fits in half the free memory: fp32
    weights and gradients, and a margin for the canary's gradients in flight (it reads
    each in a hook and drops it): ~12 bytes a parameter."""
    free = psutil.virtual_memory().available * 0.5
    params = wanted
    while params * 12 > free and params > 1e6:
        params /= 2
    return params


def reporter_overhead(spool_dir: str, url: str, params: float) -> None:
    reporter = Reporter(
        run="bench", server=url, token="t", node="bench", spool_dir=spool_dir, flush_interval=1.0
    )
    per_step_seconds(reporter)  # warm-up
    step_cost = per_step_seconds(reporter)
    model, probe, loss_fn = example_model()
    model(probe).sum().backward()
    small = sum(check_seconds(reporter, model, loss_fn, 50).values())
    amortised = small / CHECK_EVERY
    total = step_cost + amortised
    print(
        f"phase timers + step(): {step_cost * 1e6:8.1f} us/step "
        f"= {100 * step_cost / STEP_S:.4f} % of a 100 ms step"
    )
    print(
        f"checks (grad+param checksum, canary) on the example model: "
        f"{small * 1e3:.2f} ms each, every {CHECK_EVERY} steps = {amortised * 1e6:.1f} us/step"
    )
    print(
        f"total: {total * 1e6:.1f} us/step = {100 * total / STEP_S:.4f} % of a 100 ms step "
        f"(budget 1 %): {'OK' if total / STEP_S <= 0.01 else 'OVER BUDGET'}"
    )
    fits = affordable_params(params)
    model, _, loss_fn = big_model(fits)
    count = sum(p.numel() for p in model.parameters())
    big = check_seconds(reporter, model, loss_fn, 1)
    reporter.close(drain_timeout=10)
    del model
    gigabytes = count * 4 / 1e9
    scale = params / count
    print(
        f"checks on a {count / 1e9:.2f} B-parameter fp32 model ({gigabytes:.1f} GB of weights"
        f"{'' if fits == params else f'; {params / 1e9:.2f} B wanted, halved to fit memory'}):"
    )
    for name in ("grad", "param"):
        print(
            f"  {name} checksum: {big[name]:.2f} s ({gigabytes / big[name]:.2f} GB/s hashed; "
            f"{big[name] * scale:.2f} s at {params / 1e9:.2f} B)"
        )
    print(
        f"  canary: {big['canary']:.2f} s ({big['canary'] * scale:.2f} s at {params / 1e9:.2f} B)"
    )
    per_check = sum(big.values()) * scale
    print(
        f"  all three every {CHECK_EVERY} steps: {per_check / CHECK_EVERY * 1e3:.1f} ms/step "
        f"amortised = {100 * per_check / CHECK_EVERY / 1.0:.2f} % of a 1 s step. The checksums "
        "run where the tensors live (opsboard_agent.torchdigest), so on a GPU node they scale "
        "with its memory bandwidth, as the canary's backward does; bench/sdc_check.py sets "
        "them beside the old host-side BLAKE2b."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--params", type=float, default=1e9)
    parser.add_argument("--skip-reporter", action="store_true")
    parser.add_argument("--skip-node-agent", action="store_true")
    args = parser.parse_args()
    if not args.skip_node_agent:
        result = node_agent_overhead(args.seconds)
        print(
            "node agent, node_exporter + 8-GPU dcgm-exporter at 1 Hz for "
            f"{result['seconds']:.0f} s: "
            f"{result['cpu_percent']:.2f} % of one core (budget 1 %): "
            f"{'OK' if result['cpu_percent'] < 1 else 'OVER BUDGET'}; RSS "
            f"{result['rss_start_mb']:.1f} -> {result['rss_end_mb']:.1f} MB "
            f"(max {result['rss_max_mb']:.1f}); {result['batches']} batches of "
            f"{result['samples_per_batch']:.0f} samples"
        )
    if not args.skip_reporter:
        stub = Stubs()
        with tempfile.TemporaryDirectory() as spool_dir:
            reporter_overhead(spool_dir, stub.url, args.params)
        stub.close()


if __name__ == "__main__":
    main()
