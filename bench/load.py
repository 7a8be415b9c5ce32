"""The load of bench/ingest.py (and bench/commands.py): the bodies, the senders that post
them, the live-lag probe and the chart query timed under ingest."""

from __future__ import annotations

import asyncio
import gzip
import json
import multiprocessing
import socket
import threading
import time
import uuid
from urllib.parse import urlsplit

from bench.common import BenchStack

GPUS, GPU_METRICS = 8, 12
HOST_METRICS = 4
SERIES_PER_NODE = GPUS * GPU_METRICS + HOST_METRICS  # 100 series: 1,000 samples = 10 s of a node
SECONDS_PER_BATCH = 10
PROBE_INTERVAL_S = 1.2


def make_bodies(
    sender: int, count: int, base_ts: float, seconds: int = SECONDS_PER_BATCH
) -> list[bytes]:
    """`count` batches of `seconds` × 100 samples (1,000 by default) for this sender's own
    nodes, in time order. `seconds=1` is an agent's tick at 1 Hz: one point per series."""
    bodies = []
    for index in range(count):
        node = f"bench-{sender:02d}-{index % 16:02d}"
        start = base_ts + (index // 16) * seconds
        samples = []
        for second in range(seconds):
            ts = start + second
            for gpu in range(GPUS):
                for metric in range(GPU_METRICS):
                    value = (index * 7 + gpu * 13 + metric * 17 + second) % 100 + 0.5
                    samples.append(
                        {"ts": ts, "metric": f"gpu.m{metric}", "gpu": gpu, "value": value}
                    )
            for metric in range(HOST_METRICS):
                samples.append({"ts": ts, "metric": f"host.m{metric}", "value": 1.5e9 + second})
        batch = {
            "batch_id": f"{sender}-{index}-{uuid.uuid4().hex[:6]}",
            "node": node,
            "samples": samples,
        }
        bodies.append(gzip.compress(json.dumps(batch).encode(), compresslevel=1))
    return bodies


class Senders:
    """Concurrent posters; with `rate` (samples/s) they keep to that offered load."""

    def __init__(
        self,
        url: str,
        secret: str,
        bodies: list[list[bytes]],
        rate: float,
        samples_per_batch: int = SECONDS_PER_BATCH * SERIES_PER_NODE,
        path: str = "/api/v1/ingest",
        content: str = "Content-Type: application/json\r\nContent-Encoding: gzip\r\n",
    ) -> None:
        """`path` and `content` (the body's header lines) are the agent's by default; a
        Prometheus's remote write for bench/remote_write.py."""
        self.address = urlsplit(url)
        # Agents post from hosts of their own; these senders share the stack's two cores, so
        # they spend as little as they can: every request is built here, before the clock
        # starts, and written to a plain socket (post_raw). That is ~0.1 ms of CPU a POST,
        # where http.client spent ~0.6 and httpx ~1 (6-10 % of the stack's budget).
        head = (
            f"POST {path} HTTP/1.1\r\n"
            f"Host: {self.address.netloc}\r\n"
            f"Authorization: Bearer {secret}\r\n"
            f"{content}"
            "Connection: close\r\n"  # a connection per POST, as gunicorn's sync workers do
        ).encode()
        self.requests = [
            [head + b"Content-Length: %d\r\n\r\n" % len(body) + body for body in sender]
            for sender in bodies
        ]
        self.batch_interval = len(bodies) * samples_per_batch / rate if rate else 0.0
        self.latencies: list[float] = []
        self.accepted = 0
        self.failed = 0
        self.first_post = self.last_post = 0.0
        self.lock = threading.Lock()

    def run(self) -> None:
        threads = [
            threading.Thread(target=self._send, args=(requests, index / len(self.requests)))
            for index, requests in enumerate(self.requests)
        ]
        self.first_post = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.last_post = time.monotonic()

    def _send(self, requests: list[bytes], phase: float) -> None:
        for index, request in enumerate(requests):
            due = self.first_post + (index + phase) * self.batch_interval
            time.sleep(max(0.0, due - time.monotonic()))
            started = time.monotonic()
            status = post_raw(self.address.hostname, self.address.port, request)
            elapsed = time.monotonic() - started
            with self.lock:
                self.latencies.append(elapsed)
                if status == 202:
                    self.accepted += 1
                else:
                    self.failed += 1


def post_raw(host: str, port: int, request: bytes) -> int:
    """Send one whole HTTP/1.1 request on a new connection; the reply's status code, read
    from its status line once the server has closed the connection (Connection: close)."""
    with socket.create_connection((host, port), timeout=60) as connection:
        connection.sendall(request)
        reply = bytearray()
        while chunk := connection.recv(65536):
            reply += chunk
    # "HTTP/1.1 202 Accepted\r\n..."
    return int(reply[9:12]) if reply.startswith(b"HTTP/1.") else 0


class Probe:
    """Posts a one-sample batch for a probe node every 1.2 s and times its websocket delta.

    An agent posts a node's batch every second or more; the publisher sends a node at most
    once a second by design, so a faster probe would measure that hold, not the pipeline."""

    def __init__(self, stack: BenchStack, secret: str, cookie: str, cluster: str) -> None:
        self.stack, self.secret, self.cookie, self.cluster = stack, secret, cookie, cluster
        self.lags: list[float] = []
        self.stop = threading.Event()
        self.sent: dict[float, float] = {}

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        import httpx
        import websockets

        url = f"ws://127.0.0.1:{self.stack.ws_port}/ws/clusters/{self.cluster}/"
        headers = {"Cookie": self.cookie, "Origin": f"http://127.0.0.1:{self.stack.port}"}
        async with websockets.connect(url, additional_headers=headers, max_size=2**24) as ws:
            receiver = asyncio.create_task(self._receive(ws))
            async with httpx.AsyncClient(base_url=self.stack.ingest_url, timeout=30) as client:
                marker = 0.0
                while not self.stop.is_set():
                    marker += 1
                    batch = {
                        "batch_id": uuid.uuid4().hex,
                        "node": "probe",
                        "samples": [{"ts": time.time(), "metric": "probe.marker", "value": marker}],
                    }
                    self.sent[marker] = time.monotonic()
                    await client.post(
                        "/api/v1/ingest",
                        json=batch,
                        headers={"Authorization": f"Bearer {self.secret}"},
                    )
                    await asyncio.sleep(PROBE_INTERVAL_S)
            await asyncio.sleep(2)
            receiver.cancel()

    async def _receive(self, ws) -> None:
        seen: set[float] = set()
        async for message in ws:
            data = json.loads(message)
            for node in data.get("nodes", ()):
                marker = node["health"].get("host", {}).get("probe.marker")
                if node["node"] == "probe" and marker in self.sent and marker not in seen:
                    seen.add(marker)
                    self.lags.append(time.monotonic() - self.sent[marker])


class ChartQuery:
    """Repeats one chart query (an hour of one series, 1-minute buckets) and times it.

    The timing runs in a process of its own: in a thread of this one it shared the GIL with
    the senders and waited for it (up to the 5 ms switch interval each time its socket
    calls gave it back), which the server's time under ingest was then charged with. An
    operator's browser does not share a process with the agents either."""

    def __init__(self, stack: BenchStack, secret: str, start: float, end: float) -> None:
        self.url, self.secret = stack.url, secret
        self.params = {
            "node": "bench-00-00",
            "metric": "gpu.m0",
            "gpu": 0,
            "start": start,
            "end": end,
            "step": 60,
        }
        self._context = multiprocessing.get_context("spawn")
        self.stop = self._context.Event()

    def sample(self, count: int | None = None) -> list[float]:
        receiver, sender = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=chart_times_collect,
            args=(self.url, self.secret, self.params, count, self.stop, sender),
        )
        process.start()
        times = receiver.recv()
        process.join()
        return times


def chart_times_collect(url, secret, params, count, stop, sender) -> None:
    """In the sampling process: time the query every 0.2 s until `stop` or `count`."""
    import httpx

    times: list[float] = []
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set() and (count is None or len(times) < count):
            started = time.monotonic()
            client.get(
                "/api/v1/series", params=params, headers={"Authorization": f"Bearer {secret}"}
            )
            times.append(time.monotonic() - started)
            time.sleep(0.2)
    sender.send(times)
