"""The heat-map of a frontier run: past HEATMAP_RANK_ROWS ranks a row per rank is a wall no
one reads (16,384 rows) and a body of megabytes, so ranks are grouped by where they run —
whole nodes, consecutive by name, at most HEATMAP_GROUP_ROWS groups — and each cell is the
worst rank of its group in that bucket. The slowest ranks of the window keep rows of their
own at the top, so a straggler is never averaged away, and a group's row opens (drills
into) its ranks. Numpy only: the caller reads the matrix and the places."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

HEATMAP_RANK_ROWS = 1024  # up to this many ranks, a row per rank (as at 1,024 ranks before)
HEATMAP_GROUP_ROWS = 128  # at most this many group rows past it
HEATMAP_SLOWEST_ROWS = 8  # the slowest ranks of the window, each a row of its own, on top
UNPLACED = ""  # the group key of ranks whose node is not known yet


@dataclass(frozen=True)
class RankGroup:
    """Consecutive nodes (by name) and the rows (indexes into the matrix) of their ranks."""

    first_node: str
    last_node: str
    rows: tuple[int, ...]

    @property
    def label(self) -> str:
        if self.first_node == UNPLACED:
            return f"{len(self.rows)} ranks, node not known"
        nodes = (
            self.first_node
            if self.first_node == self.last_node
            else (f"{self.first_node} … {self.last_node}")
        )
        return f"{nodes} ({len(self.rows)} ranks)"

    def holds(self, node: str) -> bool:
        return self.first_node <= node <= self.last_node


def rank_groups(
    ranks: list[int], places: dict[int, tuple[str, int | None]], max_groups: int
) -> list[RankGroup]:
    """The ranks' rows grouped by whole nodes in name order, at most `max_groups` groups of
    about len(ranks) / max_groups ranks (a node never split), the ranks of no known node
    last in one group of their own."""
    by_node: dict[str, list[int]] = {}
    unplaced: list[int] = []
    for row, rank in enumerate(ranks):
        place = places.get(rank)
        (by_node.setdefault(place[0], []) if place else unplaced).append(row)
    # a group closes once it holds `target` ranks: each closed one holds at least that many,
    # so there are at most ceil(placed / target) of them, within the slots left
    slots = max(1, max_groups - (1 if unplaced else 0))
    target = max(1, math.ceil((len(ranks) - len(unplaced)) / slots))
    groups: list[RankGroup] = []
    first, last, rows = "", "", []
    for node in sorted(by_node):
        first = node if not rows else first
        last = node
        rows += by_node[node]
        if len(rows) >= target:
            groups.append(RankGroup(first, last, tuple(rows)))
            rows = []
    if rows:
        groups.append(RankGroup(first, last, tuple(rows)))
    if unplaced:
        groups.append(RankGroup(UNPLACED, UNPLACED, tuple(unplaced)))
    return groups


def group_worst(ratios: np.ndarray, groups: list[RankGroup]) -> tuple[np.ndarray, np.ndarray]:
    """Per group and bucket: the worst (highest) ratio among the group's ranks, and the row
    of the rank that has it (-1 where none of them reported)."""
    worst = np.full((len(groups), ratios.shape[1]), np.nan)
    who = np.full((len(groups), ratios.shape[1]), -1, dtype=np.int64)
    for index, group in enumerate(groups):
        block = ratios[list(group.rows)]
        reported = ~np.isnan(block)
        any_reported = reported.any(axis=0)
        if not any_reported.any():
            continue
        at = np.argmax(np.where(reported, block, -np.inf), axis=0)
        columns = np.arange(block.shape[1])
        worst[index, any_reported] = block[at, columns][any_reported]
        who[index, any_reported] = np.asarray(group.rows)[at][any_reported]
    return worst, who


def slowest_rows(ratios: np.ndarray, count: int) -> list[int]:
    """The rows of the `count` ranks slowest over the window (highest mean ratio to the
    median), slowest first; ranks that never reported are not among them."""
    if not ratios.size:
        return []
    reported = (~np.isnan(ratios)).any(axis=1)
    with np.errstate(invalid="ignore"):
        means = np.where(reported, np.nanmean(np.where(reported[:, None], ratios, 0), axis=1), -1)
    order = np.argsort(-means, kind="stable")
    return [int(row) for row in order[:count] if reported[row]]
