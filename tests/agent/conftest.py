"""Helpers for the agent's tests: the vendored fixtures (tests/fixtures) and a loopback HTTP server
(stdlib) that serves files or scripted answers. Nothing here needs Django or a database."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Third-party exposition captures, with their provenance and licences (tests/fixtures/README.md)
FIXTURES = REPO / "tests" / "fixtures"


@dataclass
class Request:
    at: float
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


# A route answers (status, headers, body) for one request.
Answer = tuple[int, dict[str, str], bytes]


@dataclass
class Loopback:
    url: str
    routes: dict[str, Callable[[Request], Answer]]
    requests: list[Request] = field(default_factory=list)


@pytest.fixture
def loopback() -> Iterator[Loopback]:
    """A stdlib HTTP server on 127.0.0.1; tests add `routes[path] = fn(request) -> answer`."""
    state = Loopback(url="", routes={})

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            request = Request(
                time.monotonic(),
                self.command,
                self.path,
                dict(self.headers.items()),
                self.rfile.read(length),
            )
            state.requests.append(request)
            route = state.routes.get(self.path.split("?")[0])
            status, headers, body = route(request) if route else (404, {}, b"not found")
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _handle

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


def serve_file(path: Path, content_type: str) -> Callable[[Request], Answer]:
    return lambda request: (200, {"Content-Type": content_type}, path.read_bytes())


def closed_port_url() -> str:
    """A loopback URL nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def supervisors():
    """Started `opsboard-agent supervise` processes, SIGTERMed after the test (which stops
    their jobs: tests/agent/test_supervise_*.py)."""
    procs = []
    yield procs.append
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
