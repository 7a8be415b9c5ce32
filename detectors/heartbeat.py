"""Heartbeat: a node that stopped sending batches is suspected down."""

from __future__ import annotations

from detectors.common import node_runs, node_subject
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.types import ClusterWindow, Finding, NodeSeen


def silence_limit(node: NodeSeen, config: DetectorConfig = DEFAULT_CONFIG) -> float:
    """Seconds of silence after which `node` is suspect: a few of its usual batch gaps, but
    never less than `heartbeat_min_s` (a node that usually batches every second may still
    pause for a few)."""
    usual = node.batch_interval or 0.0
    return max(config.heartbeat_factor * usual, config.heartbeat_min_s)


def is_silent(node: NodeSeen, now: float, config: DetectorConfig = DEFAULT_CONFIG) -> bool:
    """Heard from before, and not for longer than its `silence_limit`."""
    return node.last_seen is not None and now - node.last_seen > silence_limit(node, config)


def detect(
    window: ClusterWindow, now: float, config: DetectorConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """One critical finding (`node:<n>`) per silent node that is not cordoned; none once it
    sends again (the alert service resolves the alert)."""
    runs_of = node_runs(window)
    findings = []
    for node in sorted(window.nodes, key=lambda n: n.node):
        if node.state == "cordoned" or not is_silent(node, now, config):
            continue
        assert node.last_seen is not None
        silent = now - node.last_seen
        run = runs_of.get(node.node)
        serving = f", which serves {run}," if run else ""
        findings.append(
            Finding(
                kind="heartbeat",
                subject=node_subject(node.node),
                severity="critical",
                summary=(
                    f"{node.node}{serving} has sent nothing for {silent:.0f} s (usually every "
                    f"{node.batch_interval or 0:.0f} s): suspected down"
                ),
                run=run,
                node=node.node,
                evidence={
                    "node": node.node,
                    "last_seen": node.last_seen,
                    "silent_s": round(silent, 1),
                    "batch_interval_s": node.batch_interval,
                    "limit_s": silence_limit(node, config),
                    "state": node.state,
                },
                since=node.last_seen,
            )
        )
    return findings
