"""The heat-map of a frontier run (16,384 ranks, tests/dashboard/frontier.py), in-process:
groups of whole nodes with their worst rank, the slowest ranks on rows of their own, a body
well under a megabyte, and the drill-down into one group's ranks."""

from __future__ import annotations

import pytest

from apps.clusters.models import Cluster
from apps.dashboard.charts.rank_groups import HEATMAP_GROUP_ROWS, HEATMAP_SLOWEST_ROWS
from apps.runs.models import Run
from tests.dashboard.frontier import RANKS, RUN, SLOW_RANK, frontier_run, node_name

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(180)]

BODY_MAX = 1_000_000


def heatmap(client, cluster: str, query: str = "") -> tuple[dict, int]:
    url = f"/clusters/{cluster}/runs/{RUN}/charts/step_time.json?range=15m{query}"
    response = client.get(url)
    assert response.status_code == 200, response.content[:300]
    return response.json()["figure"]["data"][0], len(response.content)


def test_a_frontier_heatmap_groups_nodes_keeps_the_straggler_and_drills_down(client_in):
    frontier_run("frontier")
    trace, size = heatmap(client_in, "frontier")
    meta = trace["meta"]
    assert meta["rank_count"] == RANKS
    assert len(trace["y"]) == HEATMAP_SLOWEST_ROWS + HEATMAP_GROUP_ROWS
    assert size < BODY_MAX, size
    # the straggler is the slowest rank: its own row on top, named with node and GPU
    slow_node = node_name(SLOW_RANK // 8)
    assert meta["ranks"][0] == SLOW_RANK
    assert trace["y"][0] == f"r{SLOW_RANK} · {slow_node} · gpu5 (slowest)"
    # and its group's row is the hot one, each cell naming it as the worst rank
    groups = meta["groups"]
    hot = next(i for i, g in enumerate(groups) if g and g[0] <= slow_node <= g[1])
    row_max = [max(v for v in row if v is not None) for row in trace["z"]]
    group_rows = range(HEATMAP_SLOWEST_ROWS, len(row_max))
    assert max(group_rows, key=row_max.__getitem__) == hot
    assert row_max[hot] > 1.5 and sorted(row_max[i] for i in group_rows)[-2] < 1.3
    named = {cell[1] for cell in trace["customdata"][hot] if cell}
    assert named == {f"r{SLOW_RANK} · {slow_node} · gpu5"}
    assert trace["y"][hot] == f"{groups[hot][0]} … {groups[hot][1]} (128 ranks)"

    first, last = groups[hot]
    drilled, size = heatmap(client_in, "frontier", f"&node_from={first}&node_to={last}")
    assert len(drilled["meta"]["ranks"]) == 128 and SLOW_RANK in drilled["meta"]["ranks"]
    assert drilled["meta"]["group"] == [first, last] and "groups" not in drilled["meta"]
    # the groups' colours start at the typical group's worst rank, so only the hot one is
    # dark; the drill-down's ranks are coloured as a run of that size is (around the median)
    assert 1.0 < trace["zmin"] < 1.1 and trace["zmax"] < 1.5
    assert drilled["zmin"] == 0.9 and drilled["zmax"] == 1.1
    slow_row = drilled["meta"]["ranks"].index(SLOW_RANK)
    assert min(v for v in drilled["z"][slow_row] if v is not None) > 1.5
    # the export of the same moment carries the same rows
    csv = client_in.get(
        f"/clusters/frontier/runs/{RUN}/charts/step_time.csv?range=15m"
    ).content.decode()
    assert f"r{SLOW_RANK} · {slow_node} · gpu5 (slowest)" in csv


def test_a_drill_down_asks_for_names_in_order(client_in):
    Run.objects.create(cluster=Cluster.objects.create(name="frontier"), name=RUN)
    url = f"/clusters/frontier/runs/{RUN}/charts/step_time.json?range=15m"
    answer = client_in.get(f"{url}&node_from=node-0002&node_to=node-0001")
    assert answer.status_code == 400 and answer.json()["errors"][0]["loc"] == "node_to"
    answer = client_in.get(f"{url}&node_from={'n' * 256}&node_to={'n' * 257}")
    assert answer.status_code == 400 and answer.json()["errors"][0]["loc"] == "node_from"
