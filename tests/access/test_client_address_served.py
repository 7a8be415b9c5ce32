"""The servers as launched (gunicorn for pages, uvicorn for websockets and the long-poll) hand
Django the real peer and the header as sent: a login failure is recorded against the client
apps.core.client_ip names, never against an address a client made up. The "proxy" here is a
client connecting from 127.0.0.2, the one address in TRUSTED_PROXIES; uvicorn, left to its
default, would have believed any loopback client's header (--no-proxy-headers)."""

from __future__ import annotations

import re

import httpx
import pytest
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model

from tests.conftest import stack_env
from tests.stackproc import Stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
PROXY = "127.0.0.2"
FORGED, CLIENT = "198.51.100.8", "198.51.100.66"
CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker):
    env = stack_env(TRUSTED_PROXIES=PROXY)
    with django_db_blocker.unblock():
        started = Stack(env, name="client-address", publisher=False, workers=False).start()
    yield started
    started.stop()


def failed_login_from(base_url: str, source: str, forwarded: str) -> str:
    """The address axes recorded for one failed login sent from `source` with the header."""
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(base_url=base_url, transport=transport, timeout=30) as browser:
        token = CSRF_FIELD.search(browser.get("/accounts/login/").text).group(1)
        answer = browser.post(
            "/accounts/login/",
            data={"username": "vera", "password": "wrong", "csrfmiddlewaretoken": token},
            headers={"Referer": f"{base_url}/accounts/login/", "X-Forwarded-For": forwarded},
        )
    assert answer.status_code == 200  # the form again, with its error
    [attempt] = AccessAttempt.objects.filter(username="vera")
    AccessAttempt.objects.all().delete()
    return attempt.ip_address


@pytest.mark.parametrize("server", ["gunicorn", "uvicorn"])
def test_the_served_login_records_the_client_not_a_forged_address(stack, live_db, server):
    get_user_model().objects.create_user("vera", password="pw-12345-long")
    base_url = stack.url if server == "gunicorn" else f"http://127.0.0.1:{stack.ws_port}"
    # from a peer that is no trusted proxy, the header is ignored
    assert failed_login_from(base_url, "127.0.0.1", FORGED) == "127.0.0.1"
    # through the trusted proxy, the address it appended (the forged one left of it is not)
    assert failed_login_from(base_url, PROXY, f"{FORGED}, {CLIENT}") == CLIENT
