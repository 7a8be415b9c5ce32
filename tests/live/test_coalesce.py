"""A live socket's buffer (apps.live.coalesce), alone: last write wins per node, one message
per flush, a snapshot owed after a lost delta and what it leaves pending."""

from __future__ import annotations

from apps.live.coalesce import SocketBuffer


def node(node_id: int, util: float) -> dict:
    return {"id": node_id, "node": f"node-{node_id}", "health": {"0": {"gpu.util": util}}}


def test_it_keeps_the_newest_state_of_each_node_in_one_delta():
    buffer = SocketBuffer()
    buffer.snapshot(10, [])
    for seq, util in ((11, 1.0), (12, 2.0), (13, 3.0)):
        buffer.delta(seq, [node(1, util), node(seq, util)])
    message = buffer.take()
    assert message["type"] == "delta" and message["seq"] == 2
    assert {n["id"]: n["health"]["0"]["gpu.util"] for n in message["nodes"]} == {
        1: 3.0, 11: 1.0, 12: 2.0, 13: 3.0,
    }  # fmt: skip
    assert not buffer.pending and buffer.take() is None and not buffer.snapshot_due


def test_it_drops_the_deltas_a_snapshot_already_holds():
    buffer = SocketBuffer()
    buffer.snapshot(5, [])
    buffer.delta(4, [node(1, 1.0)])
    buffer.delta(5, [node(1, 2.0)])
    assert not buffer.pending


def test_it_owes_a_snapshot_after_a_lost_delta_and_keeps_what_is_newer():
    buffer = SocketBuffer()
    buffer.snapshot(5, [])
    buffer.delta(6, [node(1, 1.0)])
    buffer.delta(8, [node(2, 1.0)])  # 7 was lost on the way
    assert buffer.snapshot_due
    buffer.delta(9, [node(3, 1.0)])  # taken while the snapshot is read, after its number
    buffer.alert({"id": 7, "state": "firing"})
    snapshot = buffer.snapshot(8, [node(1, 1.0), node(2, 1.0)])
    assert snapshot == {"type": "snapshot", "seq": 2, "nodes": [node(1, 1.0), node(2, 1.0)]}
    assert not buffer.snapshot_due
    message = buffer.take()
    assert [n["id"] for n in message["nodes"]] == [3] and message["seq"] == 3
    assert message["alerts"] == [{"id": 7, "state": "firing"}]


def test_a_client_resync_is_owed_as_a_snapshot():
    buffer = SocketBuffer()
    buffer.snapshot(0, [])
    buffer.resync()
    assert buffer.pending and buffer.snapshot_due


def test_a_lone_alert_or_command_keeps_its_own_unnumbered_shape():
    buffer = SocketBuffer()
    buffer.snapshot(0, [])
    buffer.alert({"id": 1, "state": "firing"})
    buffer.alert({"id": 1, "state": "acknowledged"})
    assert buffer.take() == {"type": "alert", "alert": {"id": 1, "state": "acknowledged"}}
    buffer.command({"id": 4, "state": "issued"})
    assert buffer.take() == {"type": "command", "command": {"id": 4, "state": "issued"}}
    buffer.command({"id": 4, "state": "delivered"})
    buffer.alert({"id": 1, "state": "resolved"})
    both = buffer.take()
    assert both == {
        "type": "delta", "seq": 2, "nodes": [],
        "alerts": [{"id": 1, "state": "resolved"}],
        "commands": [{"id": 4, "state": "delivered"}],
    }  # fmt: skip
