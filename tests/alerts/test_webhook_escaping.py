"""Agent-chosen names reach Slack as plain text (`<!channel>` in a node name pings nobody)
and generic endpoints as JSON, delivered by the live stack's worker to a local receiver."""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from apps.alerts.models import WebhookEndpoint
from apps.alerts.services import alerts_sync, slack_escape
from apps.clusters.models import Cluster, Node
from apps.runs.models import Run
from launcher.procs import wait_until
from tests.alerts.conftest import finding

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

NODE = "<!channel>&<@U0123>"
RUN = "run <https://evil.example|click>"


class Receiver:
    """A local endpoint that keeps every body it is sent, with its content type."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[tuple[str, bytes]]] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.bodies.setdefault(self.path, []).append(
                    (self.headers["Content-Type"], body)
                )
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_slack_text_escapes_agent_strings_and_generic_bodies_stay_json(live_stack, live_db):
    cluster = Cluster.objects.create(name=f"esc-{uuid.uuid4().hex[:6]}")
    Node.objects.create(cluster=cluster, name=NODE)
    Run.objects.create(cluster=cluster, name=RUN)
    receiver = Receiver()
    try:
        WebhookEndpoint.objects.create(cluster=cluster, url=f"{receiver.url}/slack", format="slack")
        WebhookEndpoint.objects.create(cluster=cluster, url=f"{receiver.url}/generic")
        alerts_sync(
            cluster=cluster,
            findings=[
                finding(
                    subject=f"run:{RUN}/rank:3",
                    run=RUN,
                    node=NODE,
                    summary=f"rank 3 on {NODE} is slow <!here>",
                )
            ],
            now=time.time(),
        )
        wait_until(
            lambda: "/slack" in receiver.bodies and "/generic" in receiver.bodies,
            30,
            "both webhooks to receive the alert",
        )
    finally:
        receiver.close()

    [(slack_type, slack_raw)] = receiver.bodies["/slack"]
    assert slack_type == "application/json"
    text = json.loads(slack_raw)["text"]
    # Slack reads <...> as a mention or link and & as an entity: none may be left raw
    assert "<" not in text and ">" not in text
    assert "&lt;!channel&gt;&amp;&lt;@U0123&gt;" in text
    assert "&lt;!here&gt;" in text and "&lt;https://evil.example|click&gt;" in text
    assert text.count("&") == text.count("&amp;") + text.count("&lt;") + text.count("&gt;")

    [(generic_type, generic_raw)] = receiver.bodies["/generic"]
    assert generic_type == "application/json"
    generic = json.loads(generic_raw)  # the names travel as JSON strings, unchanged
    assert generic["alert"]["node"] == NODE and generic["alert"]["run"] == RUN


def test_slack_escape_follows_slacks_three_rules():
    assert slack_escape("a & b < c > d") == "a &amp; b &lt; c &gt; d"
    assert slack_escape("&lt;") == "&amp;lt;"  # already-escaped text stays literal
    assert slack_escape("plain *bold* _it_") == "plain *bold* _it_"
