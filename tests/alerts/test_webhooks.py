"""Outgoing webhooks through the live stack's Celery worker: retried with backoff after a
failure, delivered once, in generic JSON and Slack-compatible form."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from apps.alerts.models import Alert, WebhookDelivery, WebhookEndpoint
from apps.alerts.services import WEBHOOK_SWEEP_AGE_S, alerts_sync, webhooks_sweep
from apps.clusters.models import Cluster, Node
from launcher.procs import wait_until
from tests.alerts.conftest import finding, xid_finding

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


class Receiver:
    """A local HTTP endpoint that answers 500 to the first request on each path, then 200."""

    def __init__(self) -> None:
        self.attempts: dict[str, int] = defaultdict(int)
        self.accepted: dict[str, list[dict]] = defaultdict(list)
        self.raw: dict[str, list[tuple[bytes, dict[str, str]]]] = defaultdict(list)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = json.loads(raw)
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.raw[self.path].append((raw, headers))
                receiver.attempts[self.path] += 1
                ok = receiver.attempts[self.path] > 1
                if ok:
                    receiver.accepted[self.path].append(body)
                self.send_response(200 if ok else 500)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_an_opened_alert_reaches_each_webhook_once_after_a_failed_attempt(live_stack, live_db):
    cluster = Cluster.objects.create(name=f"hooks-{uuid.uuid4().hex[:6]}")
    Node.objects.create(cluster=cluster, name="node-05")
    xid = xid_finding()
    with Receiver() as receiver:
        WebhookEndpoint.objects.create(cluster=cluster, url=f"{receiver.url}/generic")
        WebhookEndpoint.objects.create(cluster=cluster, url=f"{receiver.url}/slack", format="slack")
        WebhookEndpoint.objects.create(cluster=cluster, url=f"{receiver.url}/off", active=False)
        alerts_sync(cluster=cluster, findings=[xid], now=time.time())
        wait_until(
            lambda: all(receiver.accepted[path] for path in ("/generic", "/slack")),
            30,
            "both webhooks to accept the alert",
        )
        time.sleep(2)  # a duplicate, if any, would arrive now
    assert {path: len(bodies) for path, bodies in receiver.accepted.items()} == {
        "/generic": 1,
        "/slack": 1,
    }
    assert receiver.attempts == {"/generic": 2, "/slack": 2}
    [generic] = receiver.accepted["/generic"]
    assert generic["event"] == "opened" and generic["cluster"] == cluster.name
    # Signed by the Standard Webhooks scheme with the endpoint's own secret: the receiver's
    # check passes, one with another endpoint's secret fails; a retry keeps its webhook-id
    secret = WebhookEndpoint.objects.get(url=f"{receiver.url}/generic").signing_secret
    other = WebhookEndpoint.objects.get(url=f"{receiver.url}/slack").signing_secret
    assert secret.startswith("whsec_") and secret != other
    (first, first_headers), (raw, headers) = receiver.raw["/generic"]
    assert Webhook(secret).verify(raw, headers) == generic
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(raw, headers)
    assert first_headers["webhook-id"] == headers["webhook-id"]
    assert generic["alert"]["kind"] == "xid" and generic["alert"]["state"] == "firing"
    assert generic["alert"]["node"] == "node-05" and generic["alert"]["gpu"] == 3
    [slack] = receiver.accepted["/slack"]
    assert list(slack) == ["text"]
    assert "xid opened" in slack["text"] and "fallen off the bus" in slack["text"]
    deliveries = WebhookDelivery.objects.filter(alert__cluster=cluster)
    assert sorted((d.attempts, d.delivered_at is not None) for d in deliveries) == [
        (2, True),
        (2, True),
    ]


def test_the_sweep_enqueues_deliveries_that_were_never_attempted(live_stack, live_db):
    cluster = Cluster.objects.create(name=f"sweep-{uuid.uuid4().hex[:6]}")
    now = time.time()
    alerts_sync(cluster=cluster, findings=[finding()], now=now)  # no endpoint yet
    with Receiver() as receiver:
        endpoint = WebhookEndpoint.objects.create(cluster=cluster, url=f"{receiver.url}/late")
        alert = Alert.objects.get(cluster=cluster)
        delivery = WebhookDelivery.objects.create(
            endpoint=endpoint, alert=alert, event="opened", payload={"late": True}
        )
        assert webhooks_sweep(now=now) == 0  # too recent: may still be on its way
        assert webhooks_sweep(now=now + WEBHOOK_SWEEP_AGE_S + 5) == 1
        wait_until(lambda: receiver.accepted["/late"], 30, "the swept delivery")
    assert receiver.accepted["/late"] == [{"late": True}]
    delivery.refresh_from_db()
    assert delivery.attempts == 2 and delivery.delivered_at is not None
