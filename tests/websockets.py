"""The live page's websocket, opened in the test's process as a logged-in browser would."""

from __future__ import annotations

from typing import Any

from channels.testing import WebsocketCommunicator

from opsboard.asgi import application


async def cluster_socket(cluster: str, cookie: bytes) -> tuple[WebsocketCommunicator, Any]:
    """A connected socket of the cluster's live feed (`cookie`: the session's "sessionid=…"),
    and the snapshot it sent first."""
    communicator = WebsocketCommunicator(
        application,
        f"/ws/clusters/{cluster}/",
        headers=[(b"cookie", cookie), (b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")],
    )
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    return communicator, await communicator.receive_json_from(timeout=10)
