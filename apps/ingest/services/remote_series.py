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


def series_map(labels: dict[str, str], metadata: dict[str, str]) -> Mapped | Refused | None:
    """The node and plan for a series with `labels`, a Refused reason, or None when the
    series is deliberately not stored (info metrics, `_created`, histogram buckets)."""
    name = labels.get("__name__", "")
    if not name:
        return Refused("no __name__ label")
    node_label, node = _node_of(labels)
    if not node:
        wanted = ", ".join(settings.REMOTE_WRITE_NODE_LABELS)
        return Refused(f"no node label: the series has none of {wanted}")
    if len(node) > NAME_MAX_LENGTH or _BAD_NODE.search(node):
        return Refused(
            f"node {node[:64]!r} (label {node_label}): at most {NAME_MAX_LENGTH} characters,"
            " no whitespace, '/' or NUL"
        )
    dropped = settings.REMOTE_WRITE_DROP_LABELS
    kept = tuple(
        sorted(
            (k, v)
            for k, v in labels.items()
            if k != "__name__" and k != node_label and k not in dropped
        )
    )
    source = _NOT_IN_SOURCE.sub("_", labels.get("job", "")) or DEFAULT_SOURCE
    plan = _plan(name, kept, source, _family_of(name, metadata))
    return None if plan is None else Mapped(node, plan)


@lru_cache(maxsize=65536)
def _plan(name: str, labels: tuple[tuple[str, str], ...], source: str, family: Family):
    # A Prometheus writes the same series every scrape: the plan is made once per series.
    return plan_for(family, name, dict(labels), _target(source))


@lru_cache(maxsize=1024)
def _target(source: str) -> ScrapeTarget:
    return ScrapeTarget(source, "")


def _node_of(labels: dict[str, str]) -> tuple[str, str]:
    for label in settings.REMOTE_WRITE_NODE_LABELS:
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


def _family_of(name: str, metadata: dict[str, str]) -> Family:
    """The family's type from metadata (by the sample name or its family's), else by the
    name's suffix: a counter when it ends as a counter's samples do."""
    _, base = family_names(name)
    for family in (name, base):
        if family in metadata:
            return Family(metadata[family], family)
    if name.endswith(tuple(settings.REMOTE_WRITE_COUNTER_SUFFIXES)):
        return Family("counter", base)
    return Family("unknown", name)
