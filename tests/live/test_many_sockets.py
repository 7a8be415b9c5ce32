"""Many live pages connecting at one instant (the pages a restart of Redis or of the server
closed, coming back) are all accepted: each connect holds a channel-layer connection for its
group_adds, and redis-py's pool refused the 101st outright (MaxConnectionsError) until
LIVE_REDIS_MAX_CONNECTIONS sized it (docs/faults.md, 7)."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.test import Client

from tests.websockets import cluster_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

SOCKETS = 150


def test_it_accepts_150_sockets_connecting_at_once(agent_token):
    user = get_user_model().objects.create_superuser("ws-many", password="pw-12345-long")
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    cluster = agent_token[0].cluster.name

    async def scenario() -> tuple[list[BaseException], list[str]]:
        results = await asyncio.gather(
            *(cluster_socket(cluster, cookie) for _ in range(SOCKETS)), return_exceptions=True
        )
        failed = [result for result in results if isinstance(result, BaseException)]
        opened = [result for result in results if not isinstance(result, BaseException)]
        for communicator, _ in opened:
            await communicator.disconnect()
        return failed, [first["type"] for _, first in opened]

    failed, first_messages = async_to_sync(scenario)()
    assert failed == []
    assert first_messages == ["snapshot"] * SOCKETS
