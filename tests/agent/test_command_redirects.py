"""The agent's command client and the server's 307 to its long-poll port: followed with the
token to the same host (and remembered), refused to any other host or down to http."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from urllib.parse import urlsplit

import pytest

from opsboard_agent.commands import CommandClient, CommandError
from tests.agent.conftest import Request

TOKEN = "agent-secret"
EMPTY = (200, {"Content-Type": "application/json"}, json.dumps({"commands": []}).encode())


@pytest.fixture
def poll_port():
    """A second loopback server standing for the long-poll port: records what reaches it."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(dict(self.headers.items()))
            body = EMPTY[2]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], seen
    server.shutdown()
    server.server_close()


def redirect_to(base: str):
    def answer(request: Request):
        return 307, {"Location": f"{base}{request.path}"}, b""

    return answer


def test_it_follows_a_307_to_the_same_host_with_its_token_and_polls_there_after(
    loopback, poll_port
):
    port, seen = poll_port
    loopback.routes["/api/v1/commands"] = redirect_to(f"http://127.0.0.1:{port}")
    client = CommandClient(server=loopback.url, token=TOKEN)
    assert client.poll(node="node-01", wait=1, kinds=("stop",)) == []
    assert client.poll(node="node-01", wait=1, kinds=("stop",)) == []
    assert len(loopback.requests) == 1  # asked once, then straight to the poll port
    assert loopback.requests[0].headers["X-Opsboard-Redirects"] == "follow"
    assert [h["Authorization"] for h in seen] == [f"Bearer {TOKEN}"] * 2
    assert client.poll_server == f"http://127.0.0.1:{port}"


def test_it_asks_the_server_again_when_the_remembered_port_is_gone(loopback, poll_port):
    port, seen = poll_port
    loopback.routes["/api/v1/commands"] = redirect_to(f"http://127.0.0.1:{port}")
    client = CommandClient(server=loopback.url, token=TOKEN)
    client.poll_server = "http://127.0.0.1:9"  # a port nothing listens on (discard)
    with pytest.raises(OSError):
        client.poll(node="node-01", wait=1)
    assert client.poll_server is None
    assert client.poll(node="node-01", wait=1) == []
    assert len(loopback.requests) == 1 and len(seen) == 1


@pytest.mark.parametrize("target", ["http://localhost:{port}", "http://example.invalid:{port}"])
def test_it_never_sends_its_token_to_another_host(loopback, poll_port, target):
    port, seen = poll_port
    loopback.routes["/api/v1/commands"] = redirect_to(target.format(port=port))
    client = CommandClient(server=loopback.url, token=TOKEN)
    with pytest.raises(CommandError, match="another host"):
        client.poll(node="node-01", wait=1)
    assert seen == [] and client.poll_server is None


def test_it_never_follows_https_down_to_http(poll_port):
    port, _ = poll_port
    client = CommandClient(server=f"https://127.0.0.1:{port}", token=TOKEN)
    with pytest.raises(CommandError, match="refused a redirect to http"):
        client._redirect_target(urlsplit(client.server), f"http://127.0.0.1:{port}/x")
