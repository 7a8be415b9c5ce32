"""A live websocket closes the moment its login or its access ends, not at the next periodic
check: logout (the real logout view), its session deleted, `revoke_role` on its cluster. The
stack here re-checks only every 600 s, so a close within CLOSE_AT_ONCE_S is the message's."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.core.management import call_command
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from apps.access.models import ClusterRole
from apps.clusters.models import Cluster
from apps.live.consumers import CLOSE_FORBIDDEN, CLOSE_UNAUTHENTICATED
from tests.conftest import stack_env
from tests.live.test_session_lifetime import CSRF_FIELD, PASSWORD
from tests.stackproc import Stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
PERIODIC_CHECK_S = 600
CLOSE_AT_ONCE_S = 2.0
STAYS_OPEN_S = 3.0


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker):
    """gunicorn and uvicorn on the test database, the periodic session check all but off."""
    env = stack_env(LIVE_SESSION_CHECK_S=str(PERIODIC_CHECK_S))
    with django_db_blocker.unblock():
        started = Stack(env, name="socket-ends", publisher=False, workers=False).start()
    yield started
    started.stop()


@pytest.fixture
def clusters(live_db):
    return [Cluster.objects.create(name=name) for name in ("alpha", "beta")]


def user_with(username: str, *clusters: Cluster, superuser: bool = False):
    users = get_user_model().objects
    user = (users.create_superuser if superuser else users.create_user)(username, password=PASSWORD)
    for cluster in clusters:
        ClusterRole.objects.create(user=user, cluster=cluster, role="viewer")
    return user


def log_in(stack: Stack, username: str) -> httpx.Client:
    """A browser logged in through the stack's own login form."""
    browser = httpx.Client(base_url=stack.url, timeout=30)
    token = CSRF_FIELD.search(browser.get("/accounts/login/").text).group(1)
    browser.post(
        "/accounts/login/",
        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{stack.url}/accounts/login/"},
    )
    assert "sessionid" in browser.cookies
    return browser


@contextmanager
def open_socket(stack: Stack, browser: httpx.Client, cluster: str) -> Iterator[ClientConnection]:
    with connect(
        f"ws://127.0.0.1:{stack.ws_port}/ws/clusters/{cluster}/",
        additional_headers={
            "Cookie": f"sessionid={browser.cookies['sessionid']}",
            "Origin": "http://127.0.0.1",
        },
        open_timeout=10,
    ) as socket:
        assert '"snapshot"' in socket.recv(timeout=10)
        yield socket


def close_code_within(socket: ClientConnection, seconds: float) -> int:
    """The close code the server sends within `seconds` (fails if it sends none)."""
    started = time.monotonic()
    with pytest.raises(ConnectionClosed) as closed:
        while True:  # a delta or alert may come first; the close is what counts
            socket.recv(timeout=seconds + 5)
    assert time.monotonic() - started <= seconds, "closed, but not at once"
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code


def assert_open(socket: ClientConnection) -> None:
    """Nothing arrives for a while, and the socket still answers a resync with a snapshot."""
    with pytest.raises(TimeoutError):
        socket.recv(timeout=STAYS_OPEN_S)
    socket.send('{"type": "resync"}')
    assert '"snapshot"' in socket.recv(timeout=10)


def test_it_closes_the_socket_at_logout_and_leaves_the_users_other_login_open(stack, clusters):
    user_with("vera", *clusters)
    browser, other_login = log_in(stack, "vera"), log_in(stack, "vera")
    with open_socket(stack, browser, "alpha") as socket, \
            open_socket(stack, other_login, "alpha") as other:  # fmt: skip
        # what the pages' "Log out" form sends: a POST with the CSRF token
        answer = browser.post(
            "/accounts/logout/",
            data={"csrfmiddlewaretoken": browser.cookies["csrftoken"]},
            headers={"Referer": stack.url},
        )
        assert answer.status_code in (200, 302)
        assert close_code_within(socket, CLOSE_AT_ONCE_S) == CLOSE_UNAUTHENTICATED
        assert_open(other)


def test_it_closes_the_socket_when_its_session_is_deleted(stack, clusters):
    user_with("vera", *clusters)
    browser = log_in(stack, "vera")
    with open_socket(stack, browser, "alpha") as socket:
        Session.objects.filter(session_key=browser.cookies["sessionid"]).delete()
        assert close_code_within(socket, CLOSE_AT_ONCE_S) == CLOSE_UNAUTHENTICATED


def test_revoke_role_closes_that_clusters_socket_and_leaves_the_other_clusters_open(
    stack, clusters
):
    user_with("vera", *clusters)
    browser = log_in(stack, "vera")
    with open_socket(stack, browser, "alpha") as alpha, \
            open_socket(stack, browser, "beta") as beta:  # fmt: skip
        call_command("revoke_role", "vera", "alpha", stdout=io.StringIO())
        assert close_code_within(alpha, CLOSE_AT_ONCE_S) == CLOSE_FORBIDDEN
        assert_open(beta)
    assert list(ClusterRole.objects.values_list("cluster__name", flat=True)) == ["beta"]


def test_revoke_role_leaves_open_the_socket_of_a_superuser_who_sees_every_cluster(stack, clusters):
    user_with("root", clusters[0], superuser=True)
    browser = log_in(stack, "root")
    with open_socket(stack, browser, "alpha") as socket:
        call_command("revoke_role", "root", "alpha", stdout=io.StringIO())
        assert not ClusterRole.objects.exists()
        assert_open(socket)
