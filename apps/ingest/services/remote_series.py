"""What a remote-written Prometheus series becomes in Opsboard's model (docs/contract.md,
"Prometheus remote write"): which node, which metric, which GPU, gauge or counter.

The mapping is the agent's own (opsboard_agent.collectors.series.plan_for), so that a
node_exporter or dcgm-exporter series has one name whether the agent scraped it or a
Prometheus wrote it: the `job` label plays the agent's target name (`node:...`), DCGM fields
become the core `gpu.*` metrics under their `gpu`, and counters become `.rate` series.
What remote write adds is told by settings (the label rules):

- the node is the value of the first of REMOTE_WRITE_NODE_LABELS a series has
  (`opsboard_node`, dcgm-exporter's `Hostname`, then `instance` without its `:port`);
- REMOTE_WRITE_DROP_LABELS are never folded into names (a Prometheus's external labels);
- a family's type is its metadata (sent by Prometheus in requests of their own, kept in
  RemoteFamily) when there is some, else its name's suffix (REMOTE_WRITE_COUNTER_SUFFIXES:
  `_total`, a histogram's `_sum`/`_count`/`_bucket`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from django.conf import settings

from apps.core.bounds import NAME_MAX_LENGTH
from opsboard_agent.collectors.series import Plan, plan_for
from opsboard_agent.targets import ScrapeTarget

DEFAULT_SOURCE = "prometheus"
_PORT = re.compile(r"^(?P<host>\[[^\]]*\]|[^:]*):\d+$")
_NOT_IN_SOURCE = re.compile(r"[^A-Za-z0-9_]")
_BAD_NODE = re.compile(r"[\s/\x00]")
_FAMILY_SUFFIXES = ("_total", "_sum", "_count", "_bucket", "_created", "_info")


@dataclass(frozen=True, slots=True)
class Family:
    """The `family` plan_for reads: its type and name."""

    type: str
    name: str


@dataclass(frozen=True, slots=True)
class Mapped:
    """Where one series goes: its node and the agent's plan for it."""

    node: str
    plan: Plan


class Refused(str):
    """Why a series is refused (its reason is the string): it is told in the response."""


@dataclass(frozen=True, slots=True, eq=False)
class Rules:
    """The label rules (settings), read once per request. One instance stands for one set
    of rules (`rules()`), so the mapping caches key on it by identity: a cheap hash."""

    node_labels: tuple[str, ...]
    dropped: frozenset[str]
    counter_suffixes: tuple[str, ...]


def rules() -> Rules:
    """The rules the settings give now (the same instance while they stay the same)."""
    return _rules_of(
        tuple(settings.REMOTE_WRITE_NODE_LABELS),
        frozenset(settings.REMOTE_WRITE_DROP_LABELS),
        tuple(settings.REMOTE_WRITE_COUNTER_SUFFIXES),
    )


@lru_cache(maxsize=8)
def _rules_of(
    node_labels: tuple[str, ...], dropped: frozenset[str], suffixes: tuple[str, ...]
) -> Rules:
    return Rules(node_labels, dropped, suffixes)


def series_map(
    labels: dict[str, str], metadata: dict[str, str], rules: Rules
) -> Mapped | Refused | None:
    """The node and plan for a series with `labels`, a Refused reason, or None when the
    series is deliberately not stored (info metrics, `_created`, histogram buckets)."""
    name = labels.get("__name__", "")
    kind, family = (
        _family_of(name, metadata.get(name), metadata.get(family_names(name)[1]), rules)
        if metadata
        else _family_by_name(name, rules)
    )
    # A Prometheus writes the same series every scrape: each is mapped once, then looked up.
    return _mapped(tuple(labels.items()), kind, family, rules)


@lru_cache(maxsize=65536)
def _mapped(
    items: tuple[tuple[str, str], ...], kind: str, family_name: str, rules: Rules
) -> Mapped | Refused | None:
    labels = dict(items)
    family = Family(kind, family_name)
    name = labels.get("__name__", "")
    if not name:
        return Refused("no __name__ label")
    node_label, node = _node_of(labels, rules)
    if not node:
        return Refused(f"no node label: the series has none of {', '.join(rules.node_labels)}")
    if len(node) > NAME_MAX_LENGTH or _BAD_NODE.search(node):
        return Refused(
            f"node {node[:64]!r} (label {node_label}): at most {NAME_MAX_LENGTH} characters,"
            " no whitespace, '/' or NUL"
        )
    kept = {
        k: v
        for k, v in labels.items()
        if k != "__name__" and k != node_label and k not in rules.dropped
    }
    source = _NOT_IN_SOURCE.sub("_", labels.get("job", "")) or DEFAULT_SOURCE
    plan = plan_for(family, name, kept, _target(source))
    return None if plan is None else Mapped(node, plan)


@lru_cache(maxsize=1024)
def _target(source: str) -> ScrapeTarget:
    return ScrapeTarget(source, "")


def _node_of(labels: dict[str, str], rules: Rules) -> tuple[str, str]:
    for label in rules.node_labels:
        value = labels.get(label, "")
        if value:
            if label == "instance" and (match := _PORT.match(value)):
                value = match["host"].strip("[]")
            return label, value
    return "", ""


def family_names(name: str) -> tuple[str, str]:
    """The names whose metadata may type sample `name`: its own and its family's (`x_count`
    of histogram `x`)."""
    return name, next((name[: -len(s)] for s in _FAMILY_SUFFIXES if name.endswith(s)), name)


def _family_of(name: str, own: str | None, family: str | None, rules: Rules) -> tuple[str, str]:
    """The family's (type, name) from metadata (`own` for the sample name, `family` for its
    family's name), else by the name (_family_by_name)."""
    if own is not None:
        return own, name
    if family is not None:
        return family, family_names(name)[1]
    return _family_by_name(name, rules)


@lru_cache(maxsize=65536)
def _family_by_name(name: str, rules: Rules) -> tuple[str, str]:
    """A counter when the name ends as a counter's samples do, else of unknown type."""
    if name.endswith(rules.counter_suffixes):
        return "counter", family_names(name)[1]
    return "unknown", name
