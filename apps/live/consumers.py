"""Websocket /ws/clusters/<name>/: a snapshot of every node on connect, then numbered deltas.

Protocol (server → client): {"type": "snapshot", "seq": n, "nodes": [...]} then
{"type": "delta", "seq": n+1, "nodes": [...]}, ...; a client that sees a gap in `seq` sends
{"type": "resync"} and gets a new snapshot. Deltas carry whole node states, so applying one
twice is harmless. Consumers never write to the database.
"""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.live.groups import cluster_group, cluster_seq_key
from apps.live.selectors import cluster_get, node_health_list
from apps.live.services import redis_client

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404


class ClusterLiveConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        cluster = await database_sync_to_async(cluster_get)(
            name=self.scope["url_route"]["kwargs"]["cluster_name"]
        )
        if cluster is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.cluster_id = cluster.id
        self.group = cluster_group(cluster.id)
        # Join first, then read: a delta sent meanwhile is either in the snapshot or after it.
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_snapshot()

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content, **kwargs) -> None:
        if isinstance(content, dict) and content.get("type") == "resync":
            await self.send_snapshot()

    async def send_snapshot(self) -> None:
        seq, nodes = await database_sync_to_async(_snapshot)(self.cluster_id)
        await self.send_json({"type": "snapshot", "seq": seq, "nodes": nodes})

    async def live_delta(self, event) -> None:
        await self.send_json({"type": "delta", "seq": event["seq"], "nodes": event["nodes"]})

    async def alert_changed(self, event) -> None:
        """An alert opened, escalated, was acknowledged or resolved (apps.alerts.services)."""
        await self.send_json({"type": "alert", "alert": event["alert"]})


def _snapshot(cluster_id: int) -> tuple[int, list]:
    seq = int(redis_client().get(cluster_seq_key(cluster_id)) or 0)
    return seq, node_health_list(cluster_id=cluster_id)
