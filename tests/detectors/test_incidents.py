"""detectors.incidents: the causal graph folds each fault's alerts into one group."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from detectors.incidents import (
    SHARED_STORAGE,
    Cause,
    Group,
    IncidentAlert,
    fold,
    gpu_hours_lost,
    place,
)

T0 = 1_764_470_000.0


def thermal(id_: int, node: str = "node-02", gpu: int = 3, at: float = T0) -> IncidentAlert:
    return IncidentAlert(id_, "thermal", f"node:{node}/gpu:{gpu}", at, "run-1", node, gpu)


def straggler(
    id_: int, node: str = "node-02", gpu: int | None = 3, rank: int = 13, at: float = T0 + 30
) -> IncidentAlert:
    return IncidentAlert(
        id_, "straggler", f"run:run-1/rank:{rank}", at, "run-1", node, gpu, rank,
        evidence={"gpu_hours_lost_per_hour": 2.0},
    )  # fmt: skip


def xid(id_: int, code: int = 79, node: str = "node-05", at: float = T0) -> IncidentAlert:
    return IncidentAlert(
        id_, "xid", f"node:{node}/gpu:1/xid:{code}", at, "run-1", node, 1,
        evidence={"code": code, "fatal": True},
    )  # fmt: skip


def run_alert(id_: int, kind: str, at: float = T0 + 60, run: str = "run-1", **evidence):
    return IncidentAlert(id_, kind, f"run:{run}", at, run, evidence=evidence)


def sdc(id_: int, node: str = "node-07") -> IncidentAlert:
    return IncidentAlert(id_, "sdc", "run:run-1/rank:40", T0, "run-1", node, None, 40)


def test_a_throttled_gpu_and_its_straggling_rank_are_one_incident_rooted_at_the_heat():
    [group] = fold([straggler(2), thermal(1)])
    assert group.members == (1, 2)
    assert group.root == Cause("thermal", "node-02", 3, None, alert=1)


def test_a_straggler_on_another_gpu_of_the_hot_node_is_its_own_incident():
    groups = fold([thermal(1, gpu=3), straggler(2, gpu=5)])
    assert [g.members for g in groups] == [(1,), (2,)]
    assert [g.root.kind for g in groups if g.root] == ["thermal", "straggler"]


def test_a_cause_that_opens_long_after_its_symptom_is_not_its_cause():
    groups = fold([straggler(1, at=T0), thermal(2, at=T0 + 3600)])
    assert len(groups) == 2
    # a pass or two later is still the cause (thermal needs its heat sustained)
    [group] = fold([straggler(1, at=T0), thermal(2, at=T0 + 120)])
    assert group.root is not None and group.root.alert == 2


def test_an_nvlink_xid_a_slow_fabric_and_the_hang_fold_to_the_xid():
    [group] = fold([run_alert(3, "hang", at=T0 + 300), run_alert(2, "fabric"), xid(1)])
    assert group.members == (1, 2, 3)
    assert group.root == Cause("xid", "node-05", 1, None, alert=1)
    assert [c.alert for c in group.candidates] == [1]


def test_a_silent_node_explains_the_runs_hang():
    heartbeat = IncidentAlert(1, "heartbeat", "node:node-04", T0, "run-1", "node-04")
    hang = run_alert(2, "hang", silent_nodes=["node-04"])
    [group] = fold([hang, heartbeat])
    assert group.root is not None and group.root.kind == "heartbeat"


def test_two_silent_nodes_leave_the_hang_with_two_candidates_and_no_root():
    a = IncidentAlert(1, "heartbeat", "node:node-04", T0, "run-1", "node-04")
    b = IncidentAlert(2, "heartbeat", "node:node-06", T0, "run-1", "node-06")
    [group] = fold([a, b, run_alert(3, "hang")])
    assert group.root is None
    assert [(c.kind, c.node) for c in group.candidates] == [
        ("heartbeat", "node-04"),
        ("heartbeat", "node-06"),
    ]


def test_a_starved_host_explains_its_input_bound_ranks():
    host = IncidentAlert(1, "input_bound", "node:node-03", T0, "run-1", "node-03")
    ranks = IncidentAlert(2, "input_bound", "run:run-1/node:node-03", T0, "run-1", "node-03")
    other = IncidentAlert(3, "input_bound", "run:run-1/node:node-09", T0, "run-1", "node-09")
    groups = fold([host, ranks, other])
    assert [g.members for g in groups] == [(1, 2), (3,)]
    assert groups[0].root is not None and groups[0].root.alert == 1


def test_checkpoint_uploads_of_several_runs_failing_together_blame_shared_storage():
    a = run_alert(1, "checkpoint_upload", run="run-1")
    b = run_alert(2, "checkpoint_upload", run="run-2")
    stale = run_alert(3, "checkpoint_stale", at=T0 + 400, run="run-2")
    [group] = fold([a, b, stale])
    assert group.members == (1, 2, 3)
    assert group.root == Cause(SHARED_STORAGE)
    assert [c.alert for c in group.candidates] == [1, 2]
    # one run's failed upload alone is that run's own incident
    [alone] = fold([a])
    assert alone.root is not None and alone.root.kind == "checkpoint_upload"


def test_thermal_and_power_on_one_gpu_are_one_cause_the_earliest():
    power = IncidentAlert(2, "power", "node:node-02/gpu:3", T0 + 5, "run-1", "node-02", 3)
    [group] = fold([thermal(1), power, straggler(3)])
    assert group.root is not None and group.root.alert == 1
    assert len(group.candidates) == 2


def test_a_thermal_gpu_on_one_node_and_an_sdc_on_another_stay_two_incidents():
    groups = fold([thermal(1), straggler(2), sdc(3)])
    assert [g.members for g in groups] == [(1, 2), (3,)]
    assert [g.root.kind for g in groups if g.root] == ["thermal", "sdc"]


# --- properties -----------------------------------------------------------------------

NODES = [f"node-{i:02d}" for i in range(6)]
KINDS = ["thermal", "power", "straggler", "xid", "ecc", "sdc", "fabric", "hang", "heartbeat"]
KINDS += ["input_bound", "oom_risk", "oom", "checkpoint_upload", "checkpoint_stale"]


@st.composite
def alerts(draw) -> list[IncidentAlert]:
    count = draw(st.integers(0, 25))
    out = []
    for i in range(count):
        kind = draw(st.sampled_from(KINDS))
        node = draw(st.sampled_from([*NODES, None]))
        gpu = draw(st.one_of(st.none(), st.integers(0, 3)))
        run = draw(st.sampled_from(["run-1", "run-2", None]))
        at = T0 + draw(st.integers(0, 4000))
        code = draw(st.sampled_from([13, 48, 74, 79, 145]))
        subject = f"{'node' if draw(st.booleans()) else 'run'}:{node}/{i}"
        evidence = {"code": code, "silent_nodes": [node] if node else []}
        out.append(IncidentAlert(i + 1, kind, subject, at, run, node, gpu, None, None, evidence))
    return out


@settings(max_examples=200, deadline=None)
@given(alerts(), st.randoms(use_true_random=False))
def test_every_alert_is_in_exactly_one_group_whatever_the_order(found, rng: random.Random):
    groups = fold(found)
    members = [m for g in groups for m in g.members]
    assert sorted(members) == sorted(a.id for a in found)
    shuffled = list(found)
    rng.shuffle(shuffled)
    assert fold(shuffled) == groups
    for group in groups:
        assert group.candidates, "every group has at least one candidate root"
        if group.root is not None and group.root.alert is not None:
            assert group.root.alert in group.members


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(0, 3))
def test_faults_on_different_nodes_stay_separate(faults: int, gpu: int):
    """A throttled GPU with its straggling rank on each of `faults` nodes: one group each."""
    found = []
    for i in range(faults):
        node = NODES[i]
        found.append(thermal(2 * i + 1, node=node, gpu=gpu))
        found.append(straggler(2 * i + 2, node=node, gpu=gpu, rank=10 + i))
    groups = fold(found)
    assert len(groups) == faults
    assert {g.root.node for g in groups if g.root} == set(NODES[:faults])


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 500), st.integers(0, 500), st.integers(0, 500))
def test_a_chain_folds_to_its_root(fabric_after: int, hang_after: int, noise: int):
    """xid → fabric → hang, opening in time order: one group, rooted at the XID, beside an
    unrelated alert on another run."""
    chain = [
        xid(1),
        run_alert(2, "fabric", at=T0 + fabric_after),
        run_alert(3, "hang", at=T0 + fabric_after + hang_after),
        run_alert(4, "checkpoint_stale", at=T0 + noise, run="run-2"),
    ]
    groups = fold(chain)
    assert [g.members for g in groups] == [(1, 2, 3), (4,)]
    assert groups[0].root is not None and groups[0].root.alert == 1


# --- placement across passes ----------------------------------------------------------


def test_a_new_symptom_joins_the_open_incident_of_its_cause():
    groups = fold([thermal(1), straggler(2)])
    [placement] = place(groups, {1: 70})
    assert (placement.incident, placement.joining) == (70, (2,))


def test_a_group_of_new_alerts_is_a_new_incident_and_a_known_one_is_left_alone():
    groups = fold([thermal(1), straggler(2), sdc(3)])
    placements = place(groups, {1: 70, 2: 70})
    assert [(p.incident, p.joining) for p in placements] == [(None, (3,))]


def test_a_group_over_two_incidents_adds_to_the_oldest_and_merges_nothing():
    group = Group((1, 2, 3), None, ())
    [placement] = place([group], {1: 9, 2: 4})
    assert (placement.incident, placement.joining) == (4, (3,))


@settings(max_examples=100, deadline=None)
@given(alerts(), st.data())
def test_placement_puts_every_unplaced_alert_somewhere_once(found, data):
    groups = fold(found)
    ids = [a.id for a in found]
    placed = data.draw(st.lists(st.sampled_from(ids), unique=True) if ids else st.just([]))
    incident_of = {a: 100 + a % 3 for a in placed}
    joining = [a for p in place(groups, incident_of) for a in p.joining]
    assert sorted(joining) == sorted(set(ids) - set(placed))


# --- GPU-hours lost -------------------------------------------------------------------


def test_gpu_hours_lost_counts_the_costliest_straggler_of_a_run_and_the_hang():
    slow = replace(straggler(1, at=T0), last_seen=T0 + 1800)  # 2 GPU-h/h for half an hour
    slower = replace(straggler(2, rank=14, at=T0), last_seen=T0 + 3600)  # for an hour
    hang = run_alert(3, "hang", gpu_hours_idle=4.5)
    assert gpu_hours_lost([slow, slower, hang, thermal(4)]) == 2.0 + 4.5
    assert gpu_hours_lost([thermal(4)]) == 0.0
