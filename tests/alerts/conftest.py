"""Fixtures of the alert tests: a cluster with a node and a run, findings, operators."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from apps.access.models import ClusterRole
from apps.clusters.models import Cluster, Node
from apps.runs.models import Run
from detectors.types import Finding


def finding(**fields) -> Finding:
    """A straggler finding on rank 3 of run-1 on node-02, unless told otherwise."""
    defaults = {
        "kind": "straggler",
        "subject": "run:run-1/rank:3",
        "severity": "warning",
        "summary": "rank 3 on node-02 computes 21% slower than the median rank",
        "run": "run-1",
        "node": "node-02",
        "rank": 3,
        "evidence": {"slowdown": 0.21},
    }
    return Finding(**{**defaults, **fields})


def xid_finding() -> Finding:
    """An XID 79 on node-05's GPU 3 (a node-level, critical finding)."""
    return finding(
        kind="xid",
        subject="node:node-05/gpu:3",
        severity="critical",
        summary="XID 79 on node-05 GPU 3: GPU has fallen off the bus",
        run=None,
        node="node-05",
        rank=None,
        gpu=3,
        evidence={"code": 79},
    )


@pytest.fixture
def cluster(db):
    cluster = Cluster.objects.create(name="alpha")
    Node.objects.create(cluster=cluster, name="node-02")
    Run.objects.create(cluster=cluster, name="run-1")
    return cluster


def make_operator(username: str, *, may_acknowledge: bool = True):
    """An operator (or with may_acknowledge=False a viewer) of every existing cluster."""
    user = get_user_model().objects.create_user(username, password="pw-12345-long")
    for cluster in Cluster.objects.all():
        role = "operator" if may_acknowledge else "viewer"
        ClusterRole.objects.create(user=user, cluster=cluster, role=role)
    return user
