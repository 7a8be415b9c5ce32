"""The live websocket of a cluster the user holds no role in is refused as not found."""

import pytest
from django.test import Client

from apps.live.consumers import CLOSE_NOT_FOUND
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
