"""Heartbeat: silent nodes are suspected down, cordoned ones are not."""

from __future__ import annotations

import pytest

from detectors import heartbeat
from detectors.types import NodeSeen
from tests.detectors.builders import T0, cluster


def findings(*nodes: NodeSeen, now: float = T0):
    return heartbeat.detect(cluster(nodes=nodes), now)


@pytest.mark.parametrize(("silent", "expected"), [(59, 0), (61, 1)])
def test_a_node_silent_for_three_batch_intervals_is_suspect(silent, expected):
    assert len(findings(NodeSeen("n0", T0 - silent, 20.0))) == expected


@pytest.mark.parametrize(("silent", "expected"), [(29, 0), (31, 1)])
def test_the_silence_limit_is_never_under_30_seconds(silent, expected):
    assert len(findings(NodeSeen("n0", T0 - silent, 1.0))) == expected
    assert len(findings(NodeSeen("n0", T0 - silent, None))) == expected


def test_it_names_the_node():
    (f,) = findings(NodeSeen("n0", T0 - 100, 10.0))
    assert f.kind == "heartbeat" and f.subject == "node:n0" and f.severity == "critical"
    assert f.summary.startswith("n0 has sent nothing for 100 s") and f.since == T0 - 100


def test_cordoned_never_seen_and_recovered_nodes_are_fine():
    assert findings(NodeSeen("n0", T0 - 1000, 10.0, state="cordoned")) == []
    assert findings(NodeSeen("n0", None, None)) == []
    assert findings(NodeSeen("n0", T0 - 2, 10.0)) == []
