"""Many live-page clients in one asyncio loop on a thread of the test, each modelled on
static/js/live-socket.js: connect, take the snapshot, apply numbered deltas (a gap asks for a
resync), and on close reconnect after a backoff that starts at 0.5 s, doubles to a cap, and
goes back to 0.5 s once a socket opens (the page's `retry`, with its jitter)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import websockets

RETRY_FIRST_S, RETRY_CAP_S = 0.5, 4.0  # static/js/live-socket.js: RETRY_FIRST_MS, RETRY_CAP_MS


def backoff(retry: float, rng: random.Random) -> float:
    """The page's wait before its next attempt: `retry` scaled by a jitter of 0.5–1.0, so
    that the clients of a restarted server do not all come back in the same instant."""
    return retry * (0.5 + rng.random() / 2)


@dataclass
class LiveClient:
    url: str
    cookie: str
    rng: random.Random
    view: dict[str, dict[str, Any]] = field(default_factory=dict)  # node name → last state
    changed_at: float = 0.0  # monotonic time of the last message that changed `view`
    connects: int = 0
    closes: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        retry = RETRY_FIRST_S
        while not stop.is_set():
            with contextlib.suppress(OSError, websockets.WebSocketException, TimeoutError):
                async with websockets.connect(
                    self.url,
                    additional_headers={"Cookie": self.cookie, "Origin": "http://127.0.0.1"},
                    open_timeout=10,
                ) as socket:
                    self.connects += 1
                    retry = RETRY_FIRST_S  # onopen
                    await self._listen(socket, stop)
            self.closes += 1
            if stop.is_set():
                return
            with contextlib.suppress(TimeoutError):  # onclose: wait, then connect again
                await asyncio.wait_for(stop.wait(), backoff(retry, self.rng))
            retry = min(retry * 2, RETRY_CAP_S)

    async def _listen(self, socket, stop: asyncio.Event) -> None:
        seq = None
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while True:
                received = asyncio.ensure_future(socket.recv())
                await asyncio.wait({received, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not received.done():
                    received.cancel()
                    return
                data = json.loads(received.result())
                if data["type"] == "snapshot":
                    seq = data["seq"]
                    self._apply(data["nodes"], replace=True)
                elif data["type"] == "delta":
                    if seq is not None and data["seq"] <= seq:
                        continue  # already in the snapshot
                    if seq is not None and data["seq"] != seq + 1:
                        await socket.send(json.dumps({"type": "resync"}))
                    seq = data["seq"]
                    self._apply(data["nodes"], replace=False)
        finally:
            stopped.cancel()

    def _apply(self, nodes: list[dict], *, replace: bool) -> None:
        view = {} if replace else dict(self.view)
        view.update({node["node"]: node for node in nodes})
        if view != self.view:
            self.view, self.changed_at = view, time.monotonic()  # one rebinding: read safely


class LiveClients:
    """`count` LiveClient on `url`, the cookies taken in turn, run on a thread until stop()."""

    def __init__(self, url: str, cookies: list[str], count: int, seed: int) -> None:
        rng = random.Random(seed)
        self.clients = [
            LiveClient(url, cookies[i % len(cookies)], random.Random(rng.random()))
            for i in range(count)
        ]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._stop: asyncio.Event | None = None
        self._tasks: asyncio.Future | None = None

    def start(self) -> LiveClients:
        self.thread.start()

        async def begin() -> None:
            self._stop = asyncio.Event()
            self._tasks = asyncio.gather(*(c.run(self._stop) for c in self.clients))

        asyncio.run_coroutine_threadsafe(begin(), self.loop).result(10)
        return self

    def stop(self) -> None:
        async def end() -> None:
            assert self._stop is not None and self._tasks is not None
            self._stop.set()
            await asyncio.wait_for(self._tasks, 30)

        try:
            asyncio.run_coroutine_threadsafe(end(), self.loop).result(40)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
