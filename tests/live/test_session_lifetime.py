"""An open live websocket (the live stack's uvicorn) lasts no longer than the login behind
it: logout, session expiry, deactivation and a password change close it with 4401 within
a bound, even when no delta is sent."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.utils import timezone
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from apps.access.models import ClusterRole
from apps.clusters.models import Cluster

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
# the stack re-checks every LIVE_SESSION_CHECK_S (3 s by default): well within this
CLOSE_BOUND_S = 10.0
PASSWORD = "pw-12345-long"
CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def end_by_logout(browser: httpx.Client, user) -> None:
    session_key = browser.cookies["sessionid"]
    # what the pages' "Log out" form sends: a POST with the CSRF token (here the cookie's)
    answer = browser.post(
        "/accounts/logout/",
        data={"csrfmiddlewaretoken": browser.cookies["csrftoken"]},
        headers={"Referer": f"{browser.base_url}"},
    )
    assert answer.status_code in (200, 302)
    assert not Session.objects.filter(session_key=session_key).exists()


def end_by_expiry(browser: httpx.Client, user) -> None:
    Session.objects.filter(session_key=browser.cookies["sessionid"]).update(
        expire_date=timezone.now() - timedelta(seconds=1)
    )


def end_by_deactivation(browser: httpx.Client, user) -> None:
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)


def end_by_password_change(browser: httpx.Client, user) -> None:
    user.set_password("a-new-long-password")
    user.save()  # the session's auth hash no longer matches


@pytest.fixture
def login(live_stack, live_db):
    """A session made by the stack's own login form (its SECRET_KEY signs the hash)."""
    user = get_user_model().objects.create_user("op", password=PASSWORD)
    alpha = Cluster.objects.create(name="alpha")
    ClusterRole.objects.create(user=user, cluster=alpha, role="viewer")
    with httpx.Client(base_url=live_stack.url, timeout=30) as browser:
        form = browser.get("/accounts/login/")
        token = CSRF_FIELD.search(form.text).group(1)
        browser.post(
            "/accounts/login/",
            data={"username": "op", "password": PASSWORD, "csrfmiddlewaretoken": token},
            headers={"Referer": f"{live_stack.url}/accounts/login/"},
        )
        assert "sessionid" in browser.cookies
        yield browser, user


def open_socket(live_stack, browser: httpx.Client):
    return connect(
        f"ws://127.0.0.1:{live_stack.ws_port}/ws/clusters/alpha/",
        additional_headers={
            "Cookie": f"sessionid={browser.cookies['sessionid']}",
            "Origin": "http://127.0.0.1",
        },
        open_timeout=10,
    )


@pytest.mark.parametrize(
    "end_session",
    [end_by_logout, end_by_expiry, end_by_deactivation, end_by_password_change],
    ids=["logout", "expiry", "deactivated", "password-changed"],
)
def test_it_closes_the_socket_with_4401_when_the_login_ends(live_stack, login, end_session):
    browser, user = login
    with open_socket(live_stack, browser) as socket:
        assert '"snapshot"' in socket.recv(timeout=10)
        # a valid login outlives a session check: nothing arrives, the socket stays open
        with pytest.raises(TimeoutError):
            socket.recv(timeout=4)

        end_session(browser, user)
        ended = time.monotonic()
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=CLOSE_BOUND_S + 5)
    assert time.monotonic() - ended <= CLOSE_BOUND_S
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
