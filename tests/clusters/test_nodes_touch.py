"""`nodes_touch`: one statement registers a drain's new nodes and updates the known ones."""

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from apps.clusters.models import Cluster, Node
from apps.clusters.services import nodes_touch

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 30, 12, tzinfo=UTC)


def test_it_creates_new_nodes_with_their_info_or_an_empty_one_and_returns_their_ids():
    cluster = Cluster.objects.create(name="c1")
    ids = nodes_touch(
        seen={(cluster.pk, "a"): (T0, {"gpus": 8}), (cluster.pk, "b"): (T0, None)},
        agents={(cluster.pk, "a")},
    )
    a, b = Node.objects.get(name="a"), Node.objects.get(name="b")
    assert ids == {(cluster.pk, "a"): a.pk, (cluster.pk, "b"): b.pk}
    assert (a.info, a.has_agent, a.last_seen, a.state) == ({"gpus": 8}, True, T0, "active")
    assert (b.info, b.has_agent, b.last_seen) == ({}, False, T0)


def test_a_known_node_keeps_its_info_unless_sent_and_its_newest_last_seen():
    cluster = Cluster.objects.create(name="c1")
    nodes_touch(
        seen={(cluster.pk, "a"): (T0, {"v": 1}), (cluster.pk, "b"): (T0, {"v": 2})},
        agents={(cluster.pk, "b")},
    )
    later, earlier = T0 + timedelta(seconds=5), T0 - timedelta(seconds=5)
    # a: no info, an older batch (late); b: new info, and this batch came from a trainer
    nodes_touch(seen={(cluster.pk, "a"): (earlier, None), (cluster.pk, "b"): (later, {"v": 3})})
    a, b = Node.objects.get(name="a"), Node.objects.get(name="b")
    assert (a.info, a.last_seen) == ({"v": 1}, T0)
    assert (b.info, b.last_seen, b.has_agent) == ({"v": 3}, later, True)  # has_agent sticks


def test_the_nodes_of_several_clusters_and_of_a_whole_drain_take_one_statement(monkeypatch):
    one, two = Cluster.objects.create(name="c1"), Cluster.objects.create(name="c2")
    seen = {(cluster.pk, f"n{i:02d}"): (T0, None) for cluster in (one, two) for i in range(40)}
    nodes_touch(seen=dict(list(seen.items())[:10]))  # some known, most new
    statements = []  # counted at psycopg's cursor (it bypasses Django's query log)
    execute = psycopg.Cursor.execute

    def counted(self, query, *args, **kwargs):
        statements.append(query)
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    ids = nodes_touch(seen=seen)
    monkeypatch.undo()
    assert len(statements) == 1
    assert len(ids) == 80 == Node.objects.count()
    assert ids == {(n.cluster_id, n.name): n.pk for n in Node.objects.all()}
    assert nodes_touch(seen={}) == {}
