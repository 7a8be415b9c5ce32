"""The live websocket admits only logged-in users from an allowed origin."""

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from apps.clusters.models import Cluster
from opsboard.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)


def connect(path: str, headers: list[tuple[bytes, bytes]]):
    async def attempt():
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, code = await communicator.connect(timeout=10)
        if connected:
            first = await communicator.receive_json_from(timeout=10)
            await communicator.disconnect()
            return True, first
        return False, code

    return async_to_sync(attempt)()


@pytest.fixture
def session_cookie():
    # a user who sees every cluster (apps.access scoping: tests/access/test_websocket_scoping.py)
    user = get_user_model().objects.create_superuser("op", password="pw-12345-long")
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


@pytest.fixture
def cluster():
    return Cluster.objects.create(name="alpha")


def test_it_refuses_an_anonymous_connection(cluster):
    connected, code = connect("/ws/clusters/alpha/", [(b"origin", b"http://127.0.0.1")])
    assert connected is False
    assert code == 4401


def test_it_refuses_a_foreign_origin_even_when_logged_in(cluster, session_cookie):
    connected, _ = connect(
        "/ws/clusters/alpha/",
        [(b"cookie", session_cookie), (b"origin", b"http://evil.example.com")],
    )
    assert connected is False


def test_it_refuses_a_missing_origin(cluster, session_cookie):
    connected, _ = connect("/ws/clusters/alpha/", [(b"cookie", session_cookie)])
    assert connected is False


def test_it_refuses_an_unknown_cluster(session_cookie):
    connected, code = connect(
        "/ws/clusters/nope/", [(b"cookie", session_cookie), (b"origin", b"http://127.0.0.1")]
    )
    assert (connected, code) == (False, 4404)


def test_it_admits_a_logged_in_user_and_sends_a_snapshot(cluster, session_cookie):
    connected, first = connect(
        "/ws/clusters/alpha/", [(b"cookie", session_cookie), (b"origin", b"http://127.0.0.1")]
    )
    assert connected is True
    assert first["type"] == "snapshot" and first["nodes"] == []
