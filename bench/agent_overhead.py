"""How much the training-loop reporter costs a training step.

Measures, with the reporter's flusher and sender threads live (shipping to a loopback stub
that answers 202), the per-step cost of four phase timers plus `step()`, and the amortised
cost of the corruption checks on the example model every 100 steps; prints both as a share
of a 100 ms step. The budget is 1 %. Run: python bench/agent_overhead.py
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opsboard_agent.reporter import Reporter  # noqa: E402

STEP_S = 0.100
STEPS = 20_000
CHECK_EVERY = 100


class Accept(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"batch_id": "x", "accepted": {}}'
        self.send_response(202)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def per_step_seconds(reporter: Reporter) -> float:
    phases = [reporter.phase(name) for name in ("data", "h2d", "compute", "comm")]
    started = time.perf_counter()
    for step in range(STEPS):
        for phase in phases:
            with phase:
                pass
        reporter.step(step, tokens=4096, loss=2.0)
    return (time.perf_counter() - started) / STEPS


def check_seconds(reporter: Reporter) -> float:
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
    probe = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    model(probe).sum().backward()
    rounds = 50
    started = time.perf_counter()
    for _ in range(rounds):
        reporter.record_grad_checksum(model)
        reporter.record_param_checksum(model)
        reporter.record_canary(model, lambda m: F.mse_loss(m(probe), probe[:, :1]))
    return (time.perf_counter() - started) / rounds


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Accept)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as spool_dir:
        reporter = Reporter(
            run="bench",
            server=f"http://127.0.0.1:{server.server_address[1]}",
            token="t",
            node="bench",
            spool_dir=spool_dir,
            flush_interval=1.0,
        )
        per_step_seconds(reporter)  # warm-up
        step_cost = per_step_seconds(reporter)
        check_cost = check_seconds(reporter)
        reporter.close(drain_timeout=10)
    server.shutdown()
    amortised = check_cost / CHECK_EVERY
    total = step_cost + amortised
    print(
        f"phase timers + step(): {step_cost * 1e6:8.1f} us/step "
        f"= {100 * step_cost / STEP_S:.4f} % of a 100 ms step"
    )
    print(
        f"checks (grad+param checksum, canary) on the example model: "
        f"{check_cost * 1e3:.2f} ms each, every {CHECK_EVERY} steps "
        f"= {amortised * 1e6:.1f} us/step"
    )
    print(
        f"total: {total * 1e6:.1f} us/step = {100 * total / STEP_S:.4f} % of a 100 ms step "
        f"(budget 1 %): {'OK' if total / STEP_S <= 0.01 else 'OVER BUDGET'}"
    )


if __name__ == "__main__":
    main()
