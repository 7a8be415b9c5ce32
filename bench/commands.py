"""Long-poll benchmark: does holding 1,000 agents' command polls cost ingest, and how fast does
an issued command reach its agent?

    make bench            # or: python bench/commands.py --agents 1000 --commands 200

One stack (bench/common.py, as `make run` starts it: gunicorn for HTTP, uvicorn for
websockets and the long-poll), the ingest senders of bench/ingest.py at the paced benchmark
rate, in three phases of `--seconds` each:
  (a) ingest alone;
  (b) the same ingest while `--agents` agents (one cluster token, a node each) hold long-polls
      the way opsboard_agent does (a first poll to the base URL, its 307 followed to the
      long-poll port and remembered, then `wait=25` polls back to back);
  (c) the same again, while an operator issues `--commands` commands to polled nodes through
      the operator API: issue → received by the agent's poll (then acked, as an agent does).
Prints samples/s accepted and end to end, the drop of (b) against (a) in %, POST latency,
and the delivery latency p50/p95/p99 against the limits (drop < 10 %, p99 < 1 s); exits 1
if one is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode, urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import BenchStack, inbox_wait_empty, percentile, prepare_database  # noqa: E402
from bench.load import Senders, make_bodies  # noqa: E402

CLUSTER, RUN = "bench", "bench-run"
POLL_WAIT_S = 25  # opsboard_agent's CommandPoller default
MAX_DROP_PCT, MAX_P99_S = 10.0, 1.0


async def http_call(
    host: str, port: int, method: str, target: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request on its own connection: a few hundred bytes of asyncio, so that the
    bench's 1,000 agents cost this machine little of the CPU the server is measured on."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body:
            lines.append(f"Content-Length: {len(body)}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        answer = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name:
                answer[name.strip().lower()] = value.strip()
        length = answer.get("content-length")
        data = await (reader.readexactly(int(length)) if length else reader.read())
        return status, answer, data
    finally:
        writer.close()


@dataclass
class Agents:
    """`count` agents holding long-polls in one event loop; `received[node]` = when the
    node's first command arrived (time.monotonic(), time.time())."""

    url: str
    secret: str
    count: int
    received: dict[str, tuple[float, float]] = field(default_factory=dict)
    started: int = 0
    polls: int = 0
    errors: int = 0
    redirected: int = 0

    def __post_init__(self) -> None:
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start_all(), self.loop)

    def stop(self) -> None:
        async def cancel() -> None:
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)

    async def _start_all(self) -> None:
        self.tasks = []
        for index in range(self.count):  # spread over ~5 s, as agents starting would be
            self.tasks.append(asyncio.create_task(self._agent(f"poll-{index:04d}")))
            await asyncio.sleep(5.0 / self.count)

    async def _agent(self, node: str) -> None:
        home = urlsplit(self.url)
        host, port = home.hostname or "127.0.0.1", home.port or 80
        headers = {"Authorization": f"Bearer {self.secret}", "X-Opsboard-Redirects": "follow"}
        target = "/api/v1/commands?" + urlencode({"node": node, "wait": POLL_WAIT_S})
        counted = False
        while True:
            try:
                if not counted:
                    self.started += 1
                    counted = True
                    if self.started == self.count:
                        self.ready.set()
                status, answer, body = await http_call(host, port, "GET", target, headers)
                self.polls += 1
                if status in (307, 308):
                    self.redirected += 1
                    location = urlsplit(answer["location"])
                    port = location.port or port
                    continue
                if status != 200:
                    self.errors += 1
                    await asyncio.sleep(1)
                    continue
                for command in json.loads(body)["commands"]:
                    self.received.setdefault(node, (time.monotonic(), time.time()))
                    await self._ack(command["id"])
            except (OSError, asyncio.IncompleteReadError, ValueError):
                self.errors += 1
                port = home.port or 80  # ask the base URL again, as the agent client does
                await asyncio.sleep(1)

    async def _ack(self, command_id: str) -> None:
        home = urlsplit(self.url)
        body = json.dumps({"state": "succeeded", "detail": "bench"}).encode()
        headers = {"Authorization": f"Bearer {self.secret}", "Content-Type": "application/json"}
        await http_call(
            home.hostname or "127.0.0.1",
            home.port or 80,
            "POST",
            f"/api/v1/commands/{command_id}/ack",
            headers,
            body,
        )


def issue_commands(stack: BenchStack, user_secret: str, count: int, seconds: float) -> dict:
    """`count` stop commands, one per polled node, spread over `seconds`: node -> (when the
    POST was sent, time.monotonic(); the command's issued_at, the server's time.time())."""
    import httpx

    issued: dict[str, tuple[float, float]] = {}
    statuses: list[int] = []
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        for index in range(count):
            node = f"poll-{index * 5 % 1000:04d}"
            sent = time.monotonic()
            response = http.post(
                "/api/v1/commands",
                json={"kind": "stop", "run": RUN, "node": node, "reason": "bench"},
                headers={
                    "Authorization": f"Bearer {user_secret}",
                    "Idempotency-Key": uuid.uuid4().hex,
                },
            )
            statuses.append(response.status_code)
            issued[node] = (sent, response.json().get("issued_at", 0.0))
            time.sleep(max(0.0, seconds / count - (time.monotonic() - sent)))
    if set(statuses) != {201}:
        raise SystemExit(f"issuing commands failed: {sorted(set(statuses))}")
    return issued


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc): what the long-poll server spent,
    a measure the other load of a shared machine does not blur as it blurs rates."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class IngestPhase:
    accepted_rate: float
    e2e_rate: float
    p50: float
    p99: float
    failed: int


def ingest_phase(stack: BenchStack, conninfo: str, secret: str, bodies, rate: float) -> IngestPhase:
    senders = Senders(stack.url, secret, bodies, rate)
    senders.run()
    inbox_wait_empty(conninfo)
    committed_at = time.monotonic()
    samples = sum(len(b) for b in bodies) * 1000
    return IngestPhase(
        accepted_rate=senders.accepted * 1000 / (senders.last_post - senders.first_post),
        e2e_rate=samples / (committed_at - senders.first_post),
        p50=percentile(senders.latencies, 50),
        p99=percentile(senders.latencies, 99),
        failed=senders.failed,
    )


SEED = """
from apps.clusters.models import Cluster, Node
from apps.runs.models import Run
cluster = Cluster.objects.get(name={cluster!r})
Node.objects.bulk_create(
    [Node(cluster=cluster, name=f"poll-{{i:04d}}") for i in range({agents})],
    ignore_conflicts=True,
)
Run.objects.get_or_create(cluster=cluster, name={run!r})
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--commands", type=int, default=200)
    parser.add_argument("--rate", type=float, default=120_000, help="offered samples/s")
    parser.add_argument("--seconds", type=float, default=20, help="of ingest per phase")
    parser.add_argument("--senders", type=int, default=6)
    parser.add_argument("--web-workers", type=int, default=3)
    parser.add_argument("--worker-concurrency", type=int, default=2)
    args = parser.parse_args()

    env, conninfo = prepare_database()
    stack = BenchStack(env, web_workers=args.web_workers, concurrency=args.worker_concurrency)
    stack.start()
    try:
        return run(args, stack, conninfo)
    finally:
        stack.stop()


def run(args, stack: BenchStack, conninfo: str) -> int:
    secret = stack.manage("issue_token", CLUSTER).strip()
    stack.manage("shell", "-c", SEED.format(cluster=CLUSTER, agents=args.agents, run=RUN))
    stack.manage("demo_operator", "--username", "bench", "--password", "bench-password-1")
    user_secret = stack.manage("issue_user_token", "bench").strip().split()[-1]
    per_sender = int(args.rate * args.seconds / 1000 / args.senders)
    base_ts = time.time() - 3 * 3600
    print(f"preparing 3 x {per_sender * args.senders} batches of 1,000 samples...", flush=True)
    alone_bodies = [make_bodies(s, per_sender, base_ts) for s in range(args.senders)]
    polled_bodies = [
        make_bodies(s + args.senders, per_sender, base_ts) for s in range(args.senders)
    ]
    issuing_bodies = [
        make_bodies(s + 2 * args.senders, per_sender, base_ts) for s in range(args.senders)
    ]

    print(f"(a) ingest alone, {args.seconds:.0f} s...", flush=True)
    alone = ingest_phase(stack, conninfo, secret, alone_bodies, args.rate)

    agents = Agents(url=stack.url, secret=secret, count=args.agents)
    agents.start()
    if not agents.ready.wait(60):
        raise SystemExit(f"only {agents.started} of {args.agents} agents started")
    time.sleep(3)  # the last ones are held
    print(f"(b) ingest with {args.agents} long-polls held...", flush=True)
    ws_pid = stack.processes[list(stack.commands).index("ws")].pid
    ws_cpu, polls_before, started = cpu_seconds(ws_pid), agents.polls, time.monotonic()
    polled = ingest_phase(stack, conninfo, secret, polled_bodies, args.rate)
    ws_cpu = cpu_seconds(ws_pid) - ws_cpu
    ws_window, ws_polls = time.monotonic() - started, agents.polls - polls_before
    print(f"(c) the same, issuing {args.commands} commands...", flush=True)
    issued: dict[str, tuple[float, float]] = {}
    issuer = threading.Thread(
        target=lambda: issued.update(
            issue_commands(stack, user_secret, args.commands, args.seconds * 0.8)
        )
    )
    issuer.start()
    issuing = ingest_phase(stack, conninfo, secret, issuing_bodies, args.rate)
    issuer.join()
    deadline = time.monotonic() + 10
    while len(agents.received) < len(issued) and time.monotonic() < deadline:
        time.sleep(0.1)
    held_polls, errors, redirected = agents.polls, agents.errors, agents.redirected
    agents.stop()

    got = {n: at for n, at in issued.items() if n in agents.received}
    # issued (committed; the server's clock) -> in the agent's hands (this machine's clock)
    latencies = [agents.received[n][1] - at[1] for n, at in got.items()]
    # the operator's whole wait: POST sent (queued behind ingest for a web worker) -> received
    round_trips = [agents.received[n][0] - at[0] for n, at in got.items()]
    drop = (1 - polled.e2e_rate / alone.e2e_rate) * 100
    p99 = percentile(latencies, 99)
    print()
    print(
        f"offered {args.rate:,.0f} samples/s for {args.seconds:.0f} s per phase, senders "
        f"{args.senders}, web workers {args.web_workers}, celery concurrency "
        f"{args.worker_concurrency}; {args.agents} agents (one token, a node each), wait "
        f"{POLL_WAIT_S} s: {held_polls} polls answered, {redirected} 307s followed, "
        f"{errors} errors"
    )
    phases = (("(a) alone", alone), ("(b) + polls", polled), ("(c) + commands", issuing))
    for name, phase in phases:
        print(
            f"{name:16} accepted {phase.accepted_rate:10,.0f} samples/s, end to end "
            f"{phase.e2e_rate:10,.0f} samples/s, POST p50 {phase.p50 * 1000:.1f} ms "
            f"p99 {phase.p99 * 1000:.1f} ms, {phase.failed} failed"
        )
    print(
        f"ingest drop      {drop:.1f} % end to end with the polls held (limit < "
        f"{MAX_DROP_PCT:.0f} %); {(1 - issuing.e2e_rate / alone.e2e_rate) * 100:.1f} % while "
        f"commands are issued and acked too"
    )
    print(
        f"long-poll server {ws_cpu:.2f} CPU s in the {ws_window:.0f} s of (b) = "
        f"{ws_cpu / ws_window * 100:.1f} % of one core, holding {args.agents} polls and "
        f"answering {ws_polls}"
    )
    print(
        f"delivery         issue -> received: p50 {percentile(latencies, 50) * 1000:.0f} ms, "
        f"p95 {percentile(latencies, 95) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms "
        f"(limit < {MAX_P99_S * 1000:.0f} ms); {len(latencies)} of {len(issued)} received"
    )
    print(
        f"operator's wait  POST sent -> received: p50 {percentile(round_trips, 50) * 1000:.0f} "
        f"ms, p99 {percentile(round_trips, 99) * 1000:.0f} ms (includes the POST's queue)"
    )
    met = drop < MAX_DROP_PCT and p99 < MAX_P99_S and len(latencies) == len(issued)
    print("limits           " + ("met" if met else "NOT MET"))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
