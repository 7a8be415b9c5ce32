"""A loopback stand-in for the server side of operator commands, speaking exactly the agent
protocol (docs/contract.md): the long poll, acks, the run plan, and ingest (to see events).
Used by the agent's tests; the live-stack tests use the real server."""

from __future__ import annotations

import gzip
import json
import threading
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.agent.conftest import Answer, Loopback, Request

TOKEN = "agent-secret"
ORDER = ("issued", "delivered", "accepted", "succeeded", "failed")


def _json(status: int, data: Any) -> Answer:
    return status, {"Content-Type": "application/json"}, json.dumps(data).encode()


class CommandStub:
    """`issue()` queues a command; polls see every command not yet `accepted` (or, with
    `redeliver=True`, every command, as a server that lost acks would)."""

    def __init__(self, loopback: Loopback, *, redeliver: bool = False) -> None:
        self.url, self.redeliver = loopback.url, redeliver
        self.loopback = loopback
        self.commands: dict[str, dict[str, Any]] = {}
        self.states: dict[str, str] = {}
        self.acks: list[tuple[str, dict[str, Any], float]] = []
        # monotonic time a poll answer first carried each command: before anything the
        # agent does with it (its acks are queued and may reach us later than that)
        self.delivered_at: dict[str, float] = {}
        self.polls: list[Request] = []
        self.batches: list[dict[str, Any]] = []
        self.plans: dict[str, dict[str, Any]] = {}
        self.fail_polls = 0  # answer this many polls with 503 first
        self.changed = threading.Condition()
        loopback.routes["/api/v1/commands"] = self._poll
        loopback.routes["/api/v1/ingest"] = self._ingest

    def issue(
        self,
        kind: str,
        *,
        run: str | None = None,
        node: str | None = None,
        expires_in: float = 600,
        **args: Any,
    ):
        """`expires_in`: seconds from now to the command's `expires_at` (negative: past)."""
        command_id = str(uuid.uuid4())
        now = time.time()
        command = {"id": command_id, "kind": kind, "run": run, "node": node, "args": args}
        command.update(issued_at=now, expires_at=now + expires_in)
        self.loopback.routes[f"/api/v1/commands/{command_id}/ack"] = self._ack
        with self.changed:
            self.commands[command_id] = command
            self.states[command_id] = "issued"
            self.changed.notify_all()
        return command_id

    def set_plan(self, run: str, plan: dict[str, Any]) -> None:
        self.plans[run] = plan
        self.loopback.routes[f"/api/v1/runs/{run}/plan"] = lambda request: (
            self._authorised(request) or _json(200, {"run": run, **plan})
        )

    def acks_of(self, command_id: str) -> list[dict[str, Any]]:
        return [body for cid, body, _ in self.acks if cid == command_id]

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [
            e for batch in list(self.batches) for e in batch.get("events", []) if e["kind"] == kind
        ]

    def wait_for(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate():
                left = deadline - time.monotonic()
                assert left > 0, f"timed out waiting for {what}"
                self.changed.wait(min(left, 0.2))

    # -- routes --------------------------------------------------------------------------

    def _authorised(self, request: Request) -> Answer | None:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return _json(401, {"errors": [{"loc": "Authorization", "msg": "bad token"}]})
        return None

    def _offered(self) -> list[dict[str, Any]]:
        return [
            command
            for cid, command in self.commands.items()
            if self.redeliver or ORDER.index(self.states[cid]) < ORDER.index("accepted")
        ]

    def _poll(self, request: Request) -> Answer:
        if refused := self._authorised(request):
            return refused
        self.polls.append(request)
        if self.fail_polls > 0:
            self.fail_polls -= 1
            return _json(503, {"errors": [{"loc": "", "msg": "overloaded"}]})
        query = parse_qs(urlsplit(request.path).query)
        deadline = time.monotonic() + min(float(query["wait"][0]), 30)
        with self.changed:
            while not (offered := self._offered()) and time.monotonic() < deadline:
                self.changed.wait(min(0.1, deadline - time.monotonic()))
            for command in offered:
                if self.states[command["id"]] == "issued":
                    self.states[command["id"]] = "delivered"
                    self.delivered_at[command["id"]] = time.monotonic()
        return _json(200, {"commands": offered})

    def _ack(self, request: Request) -> Answer:
        if refused := self._authorised(request):
            return refused
        command_id = request.path.split("/")[-2]
        body = json.loads(request.body)
        with self.changed:
            self.acks.append((command_id, body, time.monotonic()))
            current = ORDER.index(self.states[command_id])
            wanted = ORDER.index(body["state"])
            if wanted < current or (current >= ORDER.index("succeeded") and wanted != current):
                self.changed.notify_all()
                return _json(409, {"errors": [{"loc": "state", "msg": "backwards"}]})
            self.states[command_id] = body["state"]
            self.changed.notify_all()
        return _json(200, {"id": command_id, "state": body["state"]})

    def _ingest(self, request: Request) -> Answer:
        body = request.body
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        batch = json.loads(body)
        with self.changed:
            self.batches.append(batch)
            self.changed.notify_all()
        return _json(202, {"batch_id": batch["batch_id"], "accepted": {}})
