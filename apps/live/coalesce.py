"""What one live socket has yet to send, coalesced: pure Python, fed by its consumer.

The cluster's group carries numbered deltas (the publisher's, whole node states), alerts and
commands, as often as they happen. A socket sends at most one message per flush
(LIVE_SOCKET_FLUSH_S): the newest state of each node that changed since its last message
(last write wins per node), the newest row of each alert and command, or a snapshot when it
owes one. So a browser gets a bounded number of messages a second whatever the fleet's size.
"""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]


class SocketBuffer:
    """The pending state of one socket.

    `seq` is the newest cluster delta (the group's number, apps.live.groups.cluster_seq_key)
    this socket holds, in a snapshot or pending; a delta numbered at or below it is already
    held and dropped, one past a gap means the group lost one on the way (a channel over its
    capacity, Redis restarted) and the socket owes a snapshot. The messages the socket sends
    are numbered by `sent`, one after another, so the client never sees a gap of its own."""

    def __init__(self) -> None:
        self.seq = 0
        self.sent = 0
        self.snapshot_due = False
        self._nodes: dict[int, tuple[int, dict[str, Any]]] = {}  # node id → (seq, state)
        self._alerts: dict[Any, dict[str, Any]] = {}
        self._commands: dict[Any, dict[str, Any]] = {}

    @property
    def pending(self) -> bool:
        return bool(self.snapshot_due or self._nodes or self._alerts or self._commands)

    def delta(self, seq: int, nodes: list[dict[str, Any]]) -> None:
        """Take a cluster delta: each node's state replaces the one pending for it."""
        if seq <= self.seq:
            return
        if seq != self.seq + 1:
            self.snapshot_due = True
        self.seq = seq
        for node in nodes:
            self._nodes[node["id"]] = (seq, node)

    def alert(self, alert: dict[str, Any]) -> None:
        self._alerts[alert["id"]] = alert

    def command(self, command: dict[str, Any]) -> None:
        self._commands[command["id"]] = command

    def resync(self) -> None:
        """The client asked for a snapshot: the next flush is one."""
        self.snapshot_due = True

    def snapshot(self, seq: int, nodes: list[dict[str, Any]]) -> Message:
        """The snapshot message of the nodes read after the group's number was `seq`: it
        holds every delta numbered up to `seq`, so the pending states of those are dropped
        (newer ones, taken while it was read, stay pending). Alerts and commands stay too:
        a snapshot carries nodes only."""
        self.snapshot_due = False
        self.seq = max(self.seq, seq)
        self._nodes = {key: held for key, held in self._nodes.items() if held[0] > seq}
        self.sent += 1
        return {"type": "snapshot", "seq": self.sent, "nodes": nodes}

    def take(self) -> Message | None:
        """The one message of everything pending (None if nothing is), and forget it.

        Node states go in a numbered delta, with the alerts and commands that changed
        beside them (`alerts`, `commands`, present when not empty). A flush that holds a
        single alert or command and no node sends it unnumbered, as it always was."""
        nodes = [state for _, state in self._nodes.values()]
        alerts, commands = list(self._alerts.values()), list(self._commands.values())
        self._nodes, self._alerts, self._commands = {}, {}, {}
        if not nodes and len(alerts) + len(commands) <= 1:
            if alerts:
                return {"type": "alert", "alert": alerts[0]}
            return {"type": "command", "command": commands[0]} if commands else None
        self.sent += 1
        message: Message = {"type": "delta", "seq": self.sent, "nodes": nodes}
        if alerts:
            message["alerts"] = alerts
        if commands:
            message["commands"] = commands
        return message
