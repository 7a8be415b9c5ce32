"""The fast path for the text exposition format: parse only the values.

An exporter sends the same lines every scrape with new values. The first scrape (and any
whose lines differ) goes through prometheus_client's parser, which validates it and tells
each line's family and type; that gives a `Layout`: the comment lines as they were, and
for every sample line the text before its value and the plan of its series. A later scrape
with the same comments and every sample line starting with the same text, in the same
places, is the validated exposition with other numbers in it: only the numbers are parsed,
and all of it in C loops (`map`), no Python code per line. Anything else (a new series, a
changed HELP, a value the parser would refuse) goes back through the parser, so an invalid
exposition is still rejected whole. Lines with exposed timestamps are not fast-pathed."""

from __future__ import annotations

import json
import operator
import re
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import _parse_sample

from opsboard_agent.collectors.series import GAUGE, RATE, Plan, plans_for_samples
from opsboard_agent.targets import ScrapeTarget

# The whitespace and value after a sample's name and labels (no timestamp).
_VALUE_TAIL = re.compile(r"^(\s*\S*?\s+)(\S+)\s*$")


class NoFastPath(Exception):
    """The text has a line the fast path does not handle (the parser will judge it)."""


@dataclass(frozen=True)
class Emission:
    """Plans compiled for one layout: positions of plain gauges and counters with the JSON
    text of their samples up to the value; DCGM series (blank sentinels, core metrics,
    events) in `other`."""

    gauge_pos: list[int]
    gauge_json: list[str]
    rate_pos: list[int]
    rate_json: list[str]
    other: list[tuple[int, Plan]]
    duplicates: int


def compile_plans(plans: list[Plan | None], duplicates: int = 0) -> Emission:
    emission = Emission([], [], [], [], [], duplicates)
    for pos, plan in enumerate(plans):
        if plan is None:
            continue
        if plan.dcgm or plan.kind not in (GAUGE, RATE):
            emission.other.append((pos, plan))
            continue
        head = '{"metric":' + json.dumps(plan.metric)
        if plan.gpu is not None:
            head += f',"gpu":{plan.gpu}'
        head += ',"value":'
        if plan.kind is GAUGE:
            emission.gauge_pos.append(pos)
            emission.gauge_json.append(head)
        else:
            emission.rate_pos.append(pos)
            emission.rate_json.append(head)
    return emission


@dataclass(frozen=True)
class Layout:
    lines: int
    comment_at: list[int]
    comments: list[str]
    sample_at: list[int]
    prefixes: list[str]
    values_at: list[slice]
    emission: Emission

    def values(self, text: str) -> list[float] | None:
        """The sample values of `text` in line order, or None when it is not this layout."""
        lines = text.split("\n")
        if len(lines) != self.lines:
            return None
        if list(map(lines.__getitem__, self.comment_at)) != self.comments:
            return None
        samples = list(map(lines.__getitem__, self.sample_at))
        if not all(map(str.startswith, samples, self.prefixes)):
            return None
        raw: list[str] = list(map(operator.getitem, samples, self.values_at))
        if "_" in "".join(raw):  # float() takes `1_000`, the exposition format does not
            return None
        try:
            return list(map(float, raw))
        except ValueError:
            return None


def build_layout(text: str, families: list[Any], target: ScrapeTarget) -> Layout:
    """The layout of a text exposition that `families` came from (parsed and valid).
    Raises NoFastPath when a line cannot be mapped to its sample."""
    by_identity: dict[tuple[str, frozenset[tuple[str, str]]], Any] = {}
    for family in families:
        for s in family.samples:
            by_identity.setdefault((s.name, frozenset(s.labels.items())), (family, s))
    lines = text.split("\n")
    comment_at, comments, sample_at, prefixes, pairs = [], [], [], [], []
    for n, line in enumerate(lines):
        if not line.strip() or line.lstrip()[0] == "#":
            comment_at.append(n)
            comments.append(line)
            continue
        # Label values may hold spaces and braces, the value cannot: the last `}` closes
        # the labels.
        brace = line.rfind("}")
        tail = _VALUE_TAIL.match(line[brace + 1 :])
        if tail is None:
            raise NoFastPath(line)  # a timestamp, or not a sample line at all
        try:
            parsed = _parse_sample(line.strip())
        except Exception as exc:  # the parser's mix of exception types, as in scrape.py
            raise NoFastPath(line) from exc
        pair = by_identity.get((parsed.name, frozenset(parsed.labels.items())))
        if pair is None:
            raise NoFastPath(line)
        sample_at.append(n)
        prefixes.append(line[: brace + 1] + tail[1])
        pairs.append(pair)
    plans, duplicates = plans_for_samples(pairs, target)
    return Layout(
        lines=len(lines),
        comment_at=comment_at,
        comments=comments,
        sample_at=sample_at,
        prefixes=prefixes,
        values_at=[slice(len(p), None) for p in prefixes],
        emission=compile_plans(plans, duplicates),
    )
