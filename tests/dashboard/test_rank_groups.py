"""The frontier heat-map's grouping (apps.dashboard.charts.rank_groups), pure numpy: whole
nodes in name order, at most the asked number of groups, the worst rank per cell, and the
slowest ranks kept apart whatever the noise."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.dashboard.charts.rank_groups import (
    UNPLACED,
    group_worst,
    rank_groups,
    slowest_rows,
)


def places_of(ranks: int, per_node: int) -> dict[int, tuple[str, int | None]]:
    return {rank: (f"node-{rank // per_node:04d}", rank % per_node) for rank in range(ranks)}


def test_groups_are_whole_nodes_in_name_order_and_at_most_the_limit():
    ranks = list(range(16_384))
    groups = rank_groups(ranks, places_of(16_384, 8), 128)
    assert len(groups) == 128
    assert [len(g.rows) for g in groups] == [128] * 128  # 16 nodes of 8 ranks each
    assert (groups[0].first_node, groups[0].last_node) == ("node-0000", "node-0015")
    assert groups[0].label == "node-0000 … node-0015 (128 ranks)"
    assert sorted(row for g in groups for row in g.rows) == ranks


@settings(max_examples=60, deadline=None)
@given(
    ranks=st.integers(1, 3000),
    per_node=st.integers(1, 16),
    unplaced=st.integers(0, 40),
    limit=st.integers(2, 200),
)
def test_every_rank_is_in_one_group_and_no_node_is_split(ranks, per_node, unplaced, limit):
    places = places_of(ranks, per_node)
    for rank in range(unplaced):  # their node is not known yet
        places.pop(rank, None)
    groups = rank_groups(list(range(ranks)), places, limit)
    rows = [row for g in groups for row in g.rows]
    assert sorted(rows) == list(range(ranks))
    nodes_seen = {}
    for index, group in enumerate(groups):
        for row in group.rows:
            node = places[row][0] if row in places else UNPLACED
            assert nodes_seen.setdefault(node, index) == index  # one group per node
            assert group.first_node <= node <= group.last_node or node == UNPLACED
    assert len(groups) <= limit


def test_the_cell_is_the_worst_rank_and_the_slowest_ranks_come_first():
    rng = np.random.default_rng(7)
    ratios = 1 + rng.normal(0, 0.1, (64, 30))  # jitter: CV 10 %
    ratios[:, 3] += rng.choice([0, 1.5], size=64, p=[0.95, 0.05])  # spikes: a GC pause
    ratios[41] *= 1.6  # the straggler
    ratios[5, :10] = np.nan  # a rank that reported late
    groups = rank_groups(list(range(64)), places_of(64, 8), 8)
    worst, who = group_worst(ratios, groups)
    assert worst.shape == (8, 30)
    for index, group in enumerate(groups):
        block = ratios[list(group.rows)]
        np.testing.assert_allclose(worst[index], np.nanmax(block, axis=0))
        assert all(ratios[who[index, c], c] == worst[index, c] for c in range(30))
    assert (who[5] == 41).mean() > 0.9  # the straggler's group: its cells name it
    assert slowest_rows(ratios, 3)[0] == 41


def test_a_group_where_no_rank_reported_is_blank_and_names_no_rank():
    ratios = np.full((16, 4), np.nan)
    ratios[:8] = 1.0
    worst, who = group_worst(ratios, rank_groups(list(range(16)), places_of(16, 8), 2))
    assert np.isnan(worst[1]).all() and (who[1] == -1).all()
    assert slowest_rows(ratios, 20) == list(range(8))  # silent ranks are not "slowest"
