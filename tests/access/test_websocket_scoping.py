"""The live websocket of a cluster the user holds no role in is refused as not found, and
closed once the user no longer holds one (tests/live/test_socket_ends.py: at once)."""

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from apps.access.models import ClusterRole
from apps.live.consumers import CLOSE_FORBIDDEN, CLOSE_NOT_FOUND
from opsboard.asgi import application
from tests.access.conftest import user_with
from tests.live.test_websocket_security import connect

pytestmark = pytest.mark.django_db(transaction=True)


def cookie_of(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def test_it_refuses_the_socket_of_a_foreign_cluster_and_admits_its_own(clusters):
    headers = [(b"cookie", cookie_of(user_with("vera", alpha="viewer"))),
               (b"origin", b"http://127.0.0.1")]  # fmt: skip
    connected, code = connect("/ws/clusters/beta/", headers)
    assert (connected, code) == (False, CLOSE_NOT_FOUND)
    connected, first = connect("/ws/clusters/alpha/", headers)
    assert connected is True
    assert first["type"] == "snapshot"


def test_a_role_deleted_behind_the_services_back_closes_the_socket_at_the_periodic_check(
    clusters, settings
):
    """The net: no message is sent for a role deleted outside apps.access.services (a shell,
    a cascade); the periodic check closes the socket with 4403 all the same."""
    settings.LIVE_SESSION_CHECK_S = 0.5
    user = user_with("vera", alpha="viewer", beta="viewer")
    headers = [(b"cookie", cookie_of(user)), (b"origin", b"http://127.0.0.1")]

    async def watch() -> dict:
        communicator = WebsocketCommunicator(application, "/ws/clusters/alpha/", headers=headers)
        connected, _ = await communicator.connect(timeout=10)
        assert connected
        assert (await communicator.receive_json_from(timeout=10))["type"] == "snapshot"
        await database_sync_to_async(ClusterRole.objects.filter(cluster__name="alpha").delete)()
        closed = await communicator.receive_output(timeout=10)
        await communicator.wait()
        return closed

    assert async_to_sync(watch)() == {"type": "websocket.close", "code": CLOSE_FORBIDDEN}
