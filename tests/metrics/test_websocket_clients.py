"""opsboard_websocket_clients counts the live pages' open sockets."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from tests.metrics.scrape import AUTH, TOKEN, parse, value
from tests.websockets import cluster_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def clients() -> float:
    with override_settings(METRICS_TOKEN=TOKEN):
        response = Client().get("/metrics", **AUTH)
    return value(parse(response.content.decode())[0], "opsboard_websocket_clients")


def test_it_counts_an_open_socket_until_it_closes(agent_token):
    user = get_user_model().objects.create_superuser("ws-metrics", password="pw-12345-long")
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    cluster = agent_token[0].cluster.name
    before = clients()

    async def scenario() -> float:
        communicator, _ = await cluster_socket(cluster, cookie)
        from asgiref.sync import sync_to_async

        during = await sync_to_async(clients)()
        await communicator.disconnect()
        return during

    during = async_to_sync(scenario)()
    assert during == before + 1
    assert clients() == before
