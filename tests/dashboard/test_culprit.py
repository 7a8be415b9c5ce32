"""The culprit stands out: a rank's alert colours its GPU's tile alone (none when its GPU is
unknown), the heat-map runs hot where a rank is slow and names node and GPU, and a rank's
page is scoped like its run."""

import pytest
from django.test import Client

from apps.access.models import ClusterRole
from apps.alerts.models import Alert
from apps.clusters.models import Cluster
from apps.dashboard.charts.ranks import SLOW_IS_HOT
from tests.dashboard.conftest import RUN, operator
from tests.dashboard.culprit import GPUS, NODES, SLOW_RANK, slow_rank_cluster

pytestmark = pytest.mark.django_db


def tile_states(client: Client, cluster: str) -> dict[tuple[str, int], str]:
    response = client.get(f"/clusters/{cluster}/")
    assert response.status_code == 200
    return {
        (node["node"], tile["gpu"]): tile["state"]
        for node in response.context["nodes"]
        for tile in node["tiles"]
    }


def test_a_straggler_alert_colours_only_its_gpus_tile(client_in):
    slow_rank_cluster("alpha")
    alert = Alert.objects.get(kind="straggler")
    assert (alert.rank, alert.node.name, alert.gpu) == (SLOW_RANK, "node-00", SLOW_RANK)
    states = tile_states(client_in, "alpha")
    assert {key for key, state in states.items() if state != "ok"} == {("node-00", SLOW_RANK)}
    assert states["node-00", SLOW_RANK] == alert.severity
    page = client_in.get("/clusters/alpha/").context
    assert (page["healthy_gpus"], page["total_gpus"]) == (NODES * GPUS - 1, NODES * GPUS)


def test_a_straggler_alert_whose_gpu_is_unknown_colours_no_tile(client_in):
    slow_rank_cluster("alpha", with_gpu=False)
    alert = Alert.objects.get(kind="straggler")
    assert (alert.rank, alert.gpu) == (SLOW_RANK, None)
    assert set(tile_states(client_in, "alpha").values()) == {"ok"}


def test_a_node_wide_alert_still_colours_its_whole_node(client_in):
    cluster = slow_rank_cluster("alpha", evaluate=False)
    Alert.objects.create(
        cluster=cluster, kind="input_bound", subject="node:node-01", severity="warning",
        node=cluster.nodes.get(name="node-01"), summary="data loader",
        opened_at="2026-01-01T00:00Z", last_seen_at="2026-01-01T00:00Z",
    )  # fmt: skip
    states = tile_states(client_in, "alpha")
    assert {key for key, state in states.items() if state != "ok"} == {
        ("node-01", gpu) for gpu in range(GPUS)
    }


def test_the_heatmap_runs_hot_where_a_rank_is_slow_and_names_node_and_gpu(client_in):
    slow_rank_cluster("alpha", evaluate=False)
    body = client_in.get(f"/clusters/alpha/runs/{RUN}/charts/step_time.json?range=15m").json()
    trace, layout = body["figure"]["data"][0], body["figure"]["layout"]
    means = {
        rank: sum(v for v in row if v is not None) / len([v for v in row if v is not None])
        for rank, row in zip(trace["meta"]["ranks"], trace["z"], strict=True)
    }
    assert max(means, key=means.get) == SLOW_RANK
    assert means[SLOW_RANK] >= trace["zmax"] - 1e-6  # drawn in the hottest colour
    assert trace["zmin"] <= 1.0 < trace["zmax"]
    assert trace["colorscale"] == SLOW_IS_HOT and SLOW_IS_HOT[-1][1] == "#800026"  # dark red
    row = trace["meta"]["ranks"].index(SLOW_RANK)
    assert trace["y"][row] == f"r{SLOW_RANK} · node-00 · gpu{SLOW_RANK}"
    assert "%{y}" in trace["hovertemplate"] and " s per step" in trace["hovertemplate"]
    assert layout["yaxis"]["tickvals"] == trace["y"]  # every rank labelled (16 rows)


def test_the_rank_page_shows_its_split_against_its_peers(client_in):
    slow_rank_cluster("alpha", evaluate=False)
    response = client_in.get(f"/clusters/alpha/runs/{RUN}/ranks/{SLOW_RANK}/")
    assert response.status_code == 200
    figures = {item["name"]: item["figure"] for item in response.context["figures"]}
    assert {"compute_time", "comm_wait", "data_time", "step_time"} <= set(figures)
    mine, peers = figures["compute_time"]["data"]
    assert all(m > p for m, p in zip(mine["y"], peers["y"], strict=True) if m is not None)
    assert "GPU 5" in response.content.decode()


def test_the_rank_page_is_scoped_to_clusters_the_user_sees(db):
    slow_rank_cluster("alpha", evaluate=False)
    other = Cluster.objects.create(name="beta")
    user = operator("viewer", may_acknowledge=False)
    ClusterRole.objects.filter(user=user).delete()
    ClusterRole.objects.create(user=user, cluster=other, role="viewer")
    client = Client()
    client.force_login(user)
    assert client.get(f"/clusters/alpha/runs/{RUN}/ranks/1/").status_code == 404
    superuser = Client()
    superuser.force_login(operator("op"))
    assert superuser.get(f"/clusters/alpha/runs/{RUN}/ranks/1/").status_code == 200
    assert superuser.get(f"/clusters/alpha/runs/{RUN}/ranks/{NODES * GPUS}/").status_code == 404
    assert superuser.get("/clusters/alpha/runs/nope/ranks/1/").status_code == 404
