"""Operator commands, agent side: the long-poll client and a poller that executes each
command once.

    client = CommandClient(server=URL, token=TOKEN)
    poller = CommandPoller(client, node="node-07", kinds={"stop", "resume"},
                           handle=lambda command: ...).start()

Protocol (docs/contract.md): `GET /api/v1/commands?node=NAME&wait=S` answers as soon as a
command is pending (or after S ≤ 30 s with none); a server may answer it `307` to the same
host on another port (its long-poll server): the client follows with its token, to that
host only, and polls there until a connection fails; `POST /api/v1/commands/ID/ack` with
`{"state": "accepted" | "succeeded" | "failed", "detail": …}` moves it forward; a repeated
state is a no-op on the server and a backwards move is `409`.

Guarantees of the poller: a command is handed to `handle` at most once per poller, however
often the server re-delivers it (a lost ack, a restarted server): a re-delivered command is
acked again with the last state this poller sent, never executed again. Commands of other
kinds, or of another run when `run` is set, are left alone (not acked) for whichever
process on the node handles them. Network trouble and 5xx answers are retried forever with
jittered exponential backoff; acks are sent from their own thread, so a handler (or the
training loop behind it) never waits on the network.
"""

from __future__ import annotations

import http.client
import json
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, quote, urlencode, urljoin, urlsplit

from opsboard_agent.sender import backoff_delay

log = logging.getLogger(__name__)

COMMANDS_PATH = "/api/v1/commands"
MAX_WAIT = 30.0  # the contract's ceiling on one long poll
ACK_STATES = ("accepted", "succeeded", "failed")
# Seconds between polls when the server keeps offering only commands this poller leaves to
# another process (it answers at once while one is pending, so no wait would spin).
IDLE_REPOLL = 1.0
REDIRECTS = (307, 308)  # method, body and path kept: the only redirects a poll follows
# Tells the server this client follows them (with its token, to the same host only).
REDIRECTS_HEADER = {"X-Opsboard-Redirects": "follow"}
MAX_REDIRECTS = 3


class CommandError(Exception):
    """The server answered a command request with an unexpected status."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300].decode('utf-8', 'replace')}")
        self.status = status


@dataclass(frozen=True)
class Command:
    id: str
    kind: str
    run: str | None
    node: str | None
    args: dict[str, Any] = field(default_factory=dict)
    issued_at: float | None = None
    expires_at: float | None = None

    def expired(self, now: float | None = None) -> bool:
        """Past the server's `expires_at` (epoch seconds) by this node's clock: not to be
        carried out any more."""
        limit = self.expires_at
        return isinstance(limit, int | float) and (time.time() if now is None else now) >= limit

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Command:
        return cls(
            id=str(data["id"]),
            kind=str(data["kind"]),
            run=data.get("run"),
            node=data.get("node"),
            args=dict(data.get("args") or {}),
            issued_at=data.get("issued_at"),
            expires_at=data.get("expires_at"),
        )


class CommandClient:
    """One HTTP request per call (a long poll holds its own connection); raises OSError or
    http.client.HTTPException on network trouble, CommandError on an unexpected status (or
    on a redirect it refuses: to another host, or from https to http)."""

    def __init__(self, *, server: str, token: str, timeout: float = 10.0) -> None:
        self.server, self.token, self.timeout = server, token, timeout
        # Where polls go after a redirect (the server's long-poll port); None: `server`.
        self.poll_server: str | None = None

    def poll(
        self, *, node: str, wait: float, kinds: Collection[str] = (), run: str | None = None
    ) -> list[Command]:
        """`kinds` (an optional extra parameter, ignored by servers that do not know it):
        ask only for these, so that two pollers on one node do not take each other's."""
        wait = max(0.0, min(wait, MAX_WAIT))
        params = {"node": node, "wait": f"{wait:g}"}
        if kinds:
            params["kinds"] = ",".join(sorted(kinds))
        if run:
            params["run"] = run
        query = urlencode(params)
        status, body = self._poll_request(f"{COMMANDS_PATH}?{query}", timeout=wait + 15)
        if status != 200:
            raise CommandError(status, body)
        return [Command.from_json(item) for item in json.loads(body)["commands"]]

    def ack(self, command_id: str, state: str, detail: str = "", *, step: int | None = None) -> int:
        """Returns the status: 2xx moved (or already there), 409 already past `state`.
        `step` (optional, a compatible extra field): the step a checkpoint was agreed at."""
        if state not in ACK_STATES:
            raise ValueError(f"an ack is one of {ACK_STATES}, not {state!r}")
        # `detail` is the contract's name for the text; `message` the same text for servers
        # that read that name (the interface notes of issue 13 call it so).
        payload: dict[str, Any] = {"state": state, "detail": detail, "message": detail}
        if step is not None:
            payload["step"] = step
        path = f"{COMMANDS_PATH}/{quote(command_id, safe='')}/ack"
        status, body = self._request("POST", path, body=json.dumps(payload).encode())
        if status >= 300 and status != 409:
            raise CommandError(status, body)
        return status

    def plan(self, run: str) -> dict[str, Any]:
        """`GET /api/v1/runs/NAME/plan`: the newest durable checkpoint and usable nodes."""
        status, body = self._request("GET", f"/api/v1/runs/{quote(run, safe='')}/plan")
        if status != 200:
            raise CommandError(status, body)
        result: dict[str, Any] = json.loads(body)
        return result

    def _poll_request(self, path: str, *, timeout: float) -> tuple[int, bytes]:
        """GET `path` where polls go, following 307/308 to the server's own host; the target
        is remembered for the next polls and forgotten when a connection to it fails."""
        base = self.poll_server or self.server
        url = urlsplit(base.rstrip("/") + path)
        for _ in range(MAX_REDIRECTS + 1):
            try:
                status, headers, body = self._exchange(
                    "GET", url, timeout=timeout, headers=REDIRECTS_HEADER
                )
            except (OSError, http.client.HTTPException):
                self.poll_server = None  # ask the server again next time
                raise
            location = headers.get("location")
            if status not in REDIRECTS or not location:
                return status, body
            url = self._redirect_target(url, location)
            if url.path.endswith(COMMANDS_PATH):
                self.poll_server = f"{url.scheme}://{url.netloc}{url.path[: -len(COMMANDS_PATH)]}"
        raise CommandError(status, b"too many redirects")

    def _redirect_target(self, current: SplitResult, location: str) -> SplitResult:
        """The redirect's URL, if it stays on the configured server's host (any port): the
        token is never sent anywhere else, nor from https down to http."""
        target = urlsplit(urljoin(current.geturl(), location))
        home = urlsplit(self.server)
        if (target.hostname or "").lower() != (home.hostname or "").lower():
            raise CommandError(307, f"refused a redirect to another host: {location}".encode())
        if target.scheme not in ("http", "https") or (
            home.scheme == "https" and target.scheme != "https"
        ):
            raise CommandError(307, f"refused a redirect to {target.scheme}: {location}".encode())
        return target

    def _request(
        self, method: str, path: str, *, body: bytes | None = None, timeout: float | None = None
    ) -> tuple[int, bytes]:
        url = urlsplit(self.server.rstrip("/") + path)
        status, _, answer = self._exchange(method, url, body=body, timeout=timeout)
        return status, answer

    def _exchange(
        self,
        method: str,
        url: SplitResult,
        *,
        body: bytes | None = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        connection = cls(url.netloc, timeout=timeout or self.timeout)
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Accept": "application/json",
            **(headers or {}),
        }
        if body is not None:
            headers["Content-Type"] = "application/json"
        target = url.path + (f"?{url.query}" if url.query else "")
        try:
            connection.request(method, target, body=body, headers=headers)
            response = connection.getresponse()
            answer = response.read()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, answer
        finally:
            connection.close()


class CommandPoller:
    """Polls for `node`'s commands in a background thread and hands each new one of `kinds`
    (of `run`, when given) to `handle(command)`. The handler acks through `ack()`."""

    def __init__(
        self,
        client: CommandClient,
        *,
        node: str,
        handle: Callable[[Command], None],
        kinds: Collection[str],
        run: str | None = None,
        wait: float = 25.0,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.client, self.node, self.handle = client, node, handle
        self.kinds, self.run = frozenset(kinds), run
        self.wait = min(wait, MAX_WAIT)
        self.backoff_base, self.backoff_cap, self.rng = backoff_base, backoff_cap, rng
        # id -> the last (state, detail, step) acked
        self._acked: dict[str, tuple[str, str, int | None]] = {}
        self._handled: set[str] = set()
        self._lock = threading.Lock()
        self._acks: queue.Queue[tuple[str, str, str, int | None] | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.failures = 0

    def start(self) -> CommandPoller:
        for target, name in ((self._poll_loop, "poll"), (self._ack_loop, "ack")):
            thread = threading.Thread(target=target, name=f"opsboard-commands-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stops polling and sends the acks already queued for up to `timeout` seconds. A
        long poll in flight is abandoned (daemon thread), not waited for."""
        self._stop.set()
        self._acks.put(None)
        for thread in self._threads[1:]:
            thread.join(timeout)

    def ack(
        self, command: Command | str, state: str, detail: str = "", *, step: int | None = None
    ) -> None:
        """Queue an ack (sent in order, retried until the server answers)."""
        command_id = command if isinstance(command, str) else command.id
        with self._lock:
            self._acked[command_id] = (state, detail, step)
        self._acks.put((command_id, state, detail, step))

    # -- polling -------------------------------------------------------------------------

    def _wanted(self, command: Command) -> bool:
        if command.kind not in self.kinds:
            return False
        return self.run is None or command.run is None or command.run == self.run

    def poll_once(self) -> int:
        """One long poll; returns how many new commands were handed to the handler."""
        commands = self.client.poll(node=self.node, wait=self.wait, kinds=self.kinds, run=self.run)
        fresh = 0
        for command in commands:
            if not self._wanted(command):
                continue
            with self._lock:
                seen = command.id in self._handled
                self._handled.add(command.id)
                last = self._acked.get(command.id)
            if seen:
                # Re-delivered: our ack was lost or is still queued; say it again.
                if last is not None:
                    self._acks.put((command.id, *last))
                continue
            fresh += 1
            try:
                self.handle(command)
            except Exception as exc:  # a broken handler fails its command, not the poller
                log.exception("command %s (%s) failed in its handler", command.id, command.kind)
                self.ack(command, "failed", f"{type(exc).__name__}: {exc}"[:1000])
        if commands and not fresh:
            self._stop.wait(IDLE_REPOLL)
        return fresh

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
                self.failures = 0
            except (OSError, http.client.HTTPException, CommandError, ValueError) as exc:
                self.failures += 1
                delay = backoff_delay(
                    self.failures, base=self.backoff_base, cap=self.backoff_cap, rng=self.rng
                )
                level = logging.WARNING if self.failures in (1, 5) else logging.DEBUG
                log.log(level, "polling commands failed (%s); retrying in %.2f s", exc, delay)
                self._stop.wait(delay)

    # -- acks ----------------------------------------------------------------------------

    def _ack_loop(self) -> None:
        while True:
            item = self._acks.get()
            if item is None:
                return
            command_id, state, detail, step = item
            failures = 0
            while True:
                try:
                    status = self.client.ack(command_id, state, detail, step=step)
                    if status == 409:
                        log.info("command %s is already past %s", command_id, state)
                    break
                except CommandError as exc:
                    if exc.status < 500:  # 4xx: the server will never take this ack
                        log.error("ack %s of %s refused: %s", state, command_id, exc)
                        break
                    failures += 1
                except (OSError, http.client.HTTPException):
                    failures += 1
                if self._stop.is_set() and failures >= 3:
                    log.warning("giving up acking %s of %s", state, command_id)
                    break
                time.sleep(backoff_delay(failures, base=self.backoff_base, cap=5.0, rng=self.rng))
