"""Who may scrape /metrics, and the probes answering on a pod's own address."""

from __future__ import annotations

import httpx
import pytest
from django.test import Client, override_settings

from tests.metrics.scrape import AUTH, TOKEN, parse

pytestmark = [pytest.mark.django_db]

POD = {"HTTP_HOST": "10.1.2.3:8000"}  # a kubelet's probe: the pod's address, not a host name


def test_it_refuses_everyone_when_neither_token_nor_addresses_are_set():
    with override_settings(METRICS_TOKEN="", METRICS_ALLOWED_NETS=[]):
        response = Client().get("/metrics", **AUTH)
    assert response.status_code == 403
    assert response.json()["errors"][0]["loc"] == "client"


def test_it_asks_for_the_token_and_refuses_a_wrong_one():
    with override_settings(METRICS_TOKEN=TOKEN, METRICS_ALLOWED_NETS=[]):
        missing = Client().get("/metrics")
        wrong = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}x")
        basic = Client().get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}")
        good = Client().get("/metrics", **AUTH)
    for response in (missing, wrong, basic):
        assert response.status_code == 401
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert response.json()["errors"][0]["loc"] == "Authorization"
    assert good.status_code == 200
    _, families = parse(good.content.decode())
    assert {"opsboard_inbox_backlog_batches", "opsboard_ingest_batches"} <= families


def test_an_allowed_address_scrapes_without_a_token_and_a_forged_header_does_not_help():
    nets = ["192.0.2.0/24"]
    with override_settings(METRICS_TOKEN="", METRICS_ALLOWED_NETS=nets, TRUSTED_PROXIES=[]):
        allowed = Client(REMOTE_ADDR="192.0.2.7").get("/metrics")
        other = Client(REMOTE_ADDR="198.51.100.1").get("/metrics")
        forged = Client(REMOTE_ADDR="198.51.100.1").get(
            "/metrics", HTTP_X_FORWARDED_FOR="192.0.2.7"
        )
    assert allowed.status_code == 200
    assert other.status_code == 403 and forged.status_code == 403
    with override_settings(
        METRICS_TOKEN="", METRICS_ALLOWED_NETS=nets, TRUSTED_PROXIES=["198.51.100.1"]
    ):
        proxied = Client(REMOTE_ADDR="198.51.100.1").get(
            "/metrics", HTTP_X_FORWARDED_FOR="192.0.2.7"
        )
    assert proxied.status_code == 200


@override_settings(ALLOWED_HOSTS=["opsboard.example.com"], SECURE_SSL_REDIRECT=True)
def test_the_probes_answer_on_the_pod_address_over_plain_http():
    client = Client()
    assert client.get("/healthz", **POD).content == b"ok"
    assert client.get("/readyz", **POD).status_code == 200
    with override_settings(METRICS_TOKEN=TOKEN):
        assert client.get("/metrics", **POD, **AUTH).status_code == 200
    # everything else still checks the host
    assert client.get("/accounts/login/", **POD).status_code == 400


def test_the_live_stack_serves_the_scrape_to_its_token(live_stack):
    url = f"{live_stack.url}/metrics"
    headers = {"Host": "10.9.8.7:8000"}
    assert httpx.get(url, headers=headers, timeout=30).status_code == 401
    response = httpx.get(url, headers={**headers, "Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert response.status_code == 200
    samples, _ = parse(response.text)
    assert ("opsboard_redis_up", ()) in samples
    # uvicorn (ASGI) answers the probes on the pod address too
    asgi = f"http://127.0.0.1:{live_stack.ws_port}"
    ready = httpx.get(f"{asgi}/readyz", headers=headers, timeout=30)
    assert ready.status_code == 200 and ready.json()["ready"] is True
