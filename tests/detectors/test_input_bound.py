"""Input bound: ranks waiting for data, and hosts whose CPUs starve their GPUs."""

from __future__ import annotations

import pytest

from detectors import input_bound
from tests.detectors.builders import cluster, last_ts, run, series, steps


def findings(rows, telemetry=()):
    return input_bound.detect(cluster(run(rows), telemetry=telemetry), last_ts(rows))


def test_it_finds_nothing_in_a_healthy_run():
    assert findings(steps()) == []


@pytest.mark.parametrize(("share", "expected"), [(0.19, 0), (0.21, 1)])
def test_it_flags_a_node_waiting_past_the_share(share, expected):
    # n1's ranks load so long that data + h2d is `share` of the (longer) step.
    def data(rank, step):
        if rank < 8:
            return 0.03
        # solve (d + 0.01) / (d + 0.01 + 0.80 + 0.14) = share
        return share * 0.94 / (1 - share) - 0.01

    found = findings(steps(data=data))
    assert len(found) == expected
    if expected:
        (f,) = found
        assert f.subject == "run:r/node:n1" and f.node == "n1"
        assert f.evidence["stage"] == "loading" and "mostly loading" in f.summary


def test_it_says_when_staging_dominates():
    (f,) = findings(steps(h2d=lambda r, s: 0.4 if r >= 8 else 0.01))
    assert f.evidence["stage"] == "staging" and "host-to-device" in f.summary


def test_it_reports_a_run_once_when_every_node_waits():
    (f,) = findings(steps(data=lambda r, s: 0.5))
    assert f.subject == "run:r" and f.node is None and f.evidence["nodes"] == ["n0", "n1"]


def test_it_needs_the_configured_number_of_steps():
    assert findings(steps(count=19, data=lambda r, s: 0.5)) == []


def host(cpu: float, util: float, points: int = 8):
    return [
        series("n1", "host.cpu_util", [cpu] * points, gpu=None),
        *(series("n1", "gpu.util", [util] * points, gpu=g) for g in range(8)),
    ]


@pytest.mark.parametrize(
    ("cpu", "util", "points", "expected"),
    [(96, 48, 8, 1), (89, 48, 8, 0), (96, 51, 8, 0), (96, 48, 6, 0)],
)
def test_a_busy_cpu_with_idle_gpus_is_input_bound(cpu, util, points, expected):
    found = findings(steps(), host(cpu, util, points))
    assert len(found) == expected
    if expected:
        assert found[0].subject == "node:n1" and "CPU-bound" in found[0].summary


def test_host_evidence_joins_the_step_finding_of_the_same_node():
    (f,) = findings(steps(data=lambda r, s: 1.0 if r >= 8 else 0.03), host(96, 48))
    assert f.subject == "run:r/node:n1" and f.evidence["host"]["host_cpu_util"] == 96
