"""Incidents: which alerts share one root cause, by a causal graph over the detectors' evidence.

An operator at 3 a.m. should meet one page per fault, not one per symptom: a GPU throttles,
so its rank straggles, so the run loses goodput. `fold(alerts)` groups the open alerts of a
cluster by the graph below; each group is one incident, with its root cause, or none (the
root is unknown) and the candidates.

The graph (cause → symptom; each edge also needs the evidence both alerts share):

    thermal | power on (node n, GPU g)  → straggler on n: a rank on GPU g (any rank on n
                                          when its GPU is unknown), or node n as a whole
    xid on node n, an NVLink code (74, 79, the catalog's NVLINK_*)
                                        → fabric of the run n serves
    xid on node n, a fatal code         → hang of the run n serves
    ecc on (n, g)                       → sdc of a rank on n (on GPU g when it is known)
    fabric of run r                     → hang of run r
    heartbeat of node n                 → hang of the run n serves (or that names n silent)
    input_bound of node n (its host)    → input_bound of the ranks on n (`run:r/node:n`)
    oom_risk on (n, g)                  → oom on (n, g)
    oom of run r                        → hang of run r
    checkpoint_upload of run r          → checkpoint_stale of run r
    checkpoint_upload of runs r1, r2 …  ~ each other: shared storage (see below)

The straggler's "collective wait on its peers" and "goodput loss" are not alerts of their
own: the straggler finding carries them (`gpu_hours_lost_per_hour`), so they fold with it.

Time order: a cause must not open more than `tolerance_s` after its symptom (a detector
that needs a sustained condition, thermal's, may open a pass or two after the straggler it
explains; one that opens much later is a new fault, not the cause).

A group is a connected part of that graph. Its candidates are its members that nothing in
the group explains; one candidate is the root. Several candidates on one GPU (thermal and
power) are one cause: the earliest is the root. Checkpoint uploads of two or more runs that
fail together have one root no alert names, `shared_storage`. Otherwise the root is unknown
(None) and the candidates are listed.

`place(groups, incident_of)` keeps incidents stable across passes: a group with an alert
already in an incident adds its new alerts to that incident (the oldest, when it spans
several: incidents are never merged, so an id once shown keeps its alerts); a group of new
alerts only is a new incident.

Pure: frozen dataclasses in, frozen dataclasses out, no Django; the same alerts in any order
give the same groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from detectors.xid import xid_info

# A cause may open this long after its symptom (thermal needs its condition sustained for
# a while; the straggler's slow steps show sooner).
TOLERANCE_S = 600.0
SHARED_STORAGE = "shared_storage"
# The order in which candidates on one GPU are preferred as the root when they opened at
# the same moment: the heat before the power cap it often brings.
KIND_ORDER = ("thermal", "power", "xid", "ecc", "heartbeat", "input_bound", "oom_risk")


@dataclass(frozen=True)
class IncidentAlert:
    """What folding sees of one alert: its identity, where it is, when, and its evidence."""

    id: int
    kind: str
    subject: str
    opened_at: float
    run: str | None = None
    node: str | None = None
    gpu: int | None = None
    rank: int | None = None
    last_seen: float | None = None  # the last pass that saw the condition
    evidence: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class Cause:
    """A root cause: the alert's kind and place, or `shared_storage` (no alert names it)."""

    kind: str
    node: str | None = None
    gpu: int | None = None
    rank: int | None = None
    alert: int | None = None


@dataclass(frozen=True)
class Group:
    """One incident's alerts (ids, ascending), its root (None: unknown) and candidates."""

    members: tuple[int, ...]
    root: Cause | None
    candidates: tuple[Cause, ...]


@dataclass(frozen=True)
class Placement:
    """Where a group's new alerts go: `incident` (an existing id, or None for a new one)."""

    incident: int | None
    group: Group
    joining: tuple[int, ...]


def _is_nvlink(alert: IncidentAlert) -> bool:
    code = alert.evidence.get("code")
    if not isinstance(code, int):
        return False
    return code in (74, 79) or "NVLINK" in xid_info(code).mnemonic.upper()


def _is_fatal_xid(alert: IncidentAlert) -> bool:
    code = alert.evidence.get("code")
    fatal = alert.evidence.get("fatal")
    if isinstance(fatal, bool):
        return fatal
    return isinstance(code, int) and xid_info(code).fatal


def _same_run(cause: IncidentAlert, symptom: IncidentAlert) -> bool:
    return cause.run is not None and cause.run == symptom.run


def _throttle_slows_rank(cause: IncidentAlert, symptom: IncidentAlert) -> bool:
    if cause.node is None or cause.node != symptom.node:
        return False
    return symptom.gpu is None or cause.gpu is None or symptom.gpu == cause.gpu


def _nvlink_slows_fabric(cause: IncidentAlert, symptom: IncidentAlert) -> bool:
    return _same_run(cause, symptom) and _is_nvlink(cause)


def _xid_hangs_run(cause: IncidentAlert, symptom: IncidentAlert) -> bool:
    return _same_run(cause, symptom) and _is_fatal_xid(cause)


def _ecc_corrupts_rank(cause: IncidentAlert, symptom: IncidentAlert) -> bool:
    return _throttle_slows_rank(cause, symptom)


def _silent_node_hangs_run(cause: IncidentAlert, symptom: IncidentAlert) -> bool:
    silent = symptom.evidence.get("silent_nodes") or ()
    return _same_run(cause, symptom) or (cause.node is not None and cause.node in silent)


def _host_starves_ranks(cause: IncidentAlert, symptom: IncidentAlert) -> bool:
    # the host finding is `node:<n>`; the ranks' finding is `run:<r>/node:<n>`
    return (
        cause.subject.startswith("node:")
        and symptom.subject.startswith("run:")
        and cause.node is not None
        and cause.node == symptom.node
    )


def _same_gpu(cause: IncidentAlert, symptom: IncidentAlert) -> bool:
    return cause.node is not None and (cause.node, cause.gpu) == (symptom.node, symptom.gpu)


Edge = Callable[[IncidentAlert, IncidentAlert], bool]

# (cause kind, symptom kind) → whether this cause explains this symptom (beside time order).
EDGES: dict[tuple[str, str], Edge] = {
    ("thermal", "straggler"): _throttle_slows_rank,
    ("power", "straggler"): _throttle_slows_rank,
    ("xid", "fabric"): _nvlink_slows_fabric,
    ("xid", "hang"): _xid_hangs_run,
    ("ecc", "sdc"): _ecc_corrupts_rank,
    ("fabric", "hang"): _same_run,
    ("heartbeat", "hang"): _silent_node_hangs_run,
    ("input_bound", "input_bound"): _host_starves_ranks,
    ("oom_risk", "oom"): _same_gpu,
    ("oom", "hang"): _same_run,
    ("checkpoint_upload", "checkpoint_stale"): _same_run,
}


def explains(
    cause: IncidentAlert, symptom: IncidentAlert, tolerance_s: float = TOLERANCE_S
) -> bool:
    """Whether `cause` explains `symptom` by the graph: an edge of their kinds, the evidence
    it needs, and the cause not opening more than `tolerance_s` after the symptom."""
    edge = EDGES.get((cause.kind, symptom.kind))
    if edge is None or cause.id == symptom.id:
        return False
    return cause.opened_at <= symptom.opened_at + tolerance_s and edge(cause, symptom)


def _shared_storage(a: IncidentAlert, b: IncidentAlert, tolerance_s: float) -> bool:
    """Two runs' checkpoint uploads failing within `tolerance_s` of each other: the storage
    both write to, not either run."""
    return (
        a.kind == b.kind == "checkpoint_upload"
        and a.run != b.run
        and abs(a.opened_at - b.opened_at) <= tolerance_s
    )


def _cause(alert: IncidentAlert) -> Cause:
    return Cause(kind=alert.kind, node=alert.node, gpu=alert.gpu, rank=alert.rank, alert=alert.id)


def _preference(alert: IncidentAlert) -> tuple[float, int, int]:
    order = KIND_ORDER.index(alert.kind) if alert.kind in KIND_ORDER else len(KIND_ORDER)
    return (alert.opened_at, order, alert.id)


def _root(members: list[IncidentAlert], explained: set[int]) -> tuple[Cause | None, list[Cause]]:
    candidates = sorted((a for a in members if a.id not in explained), key=_preference)
    causes = [_cause(a) for a in candidates]
    if len(candidates) == 1:
        return causes[0], causes
    if candidates and all(a.kind == "checkpoint_upload" for a in candidates):
        return Cause(kind=SHARED_STORAGE), causes
    places = {(a.node, a.gpu) for a in candidates}
    if len(places) == 1 and candidates[0].node is not None:
        return causes[0], causes  # one GPU (or node): thermal and power are one heat problem
    return None, causes


def fold(alerts: Iterable[IncidentAlert], tolerance_s: float = TOLERANCE_S) -> list[Group]:
    """The alerts grouped by the causal graph (module docstring): every alert in exactly one
    group, groups ordered by their smallest alert id. Deterministic in the input's order."""
    by_id = {a.id: a for a in alerts}
    ordered = [by_id[i] for i in sorted(by_id)]
    parent = {a.id: a.id for a in ordered}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    by_kind: dict[str, list[IncidentAlert]] = {}
    for alert in ordered:
        by_kind.setdefault(alert.kind, []).append(alert)
    explained: set[int] = set()
    for (cause_kind, symptom_kind), _ in EDGES.items():
        for cause in by_kind.get(cause_kind, ()):
            for symptom in by_kind.get(symptom_kind, ()):
                if explains(cause, symptom, tolerance_s):
                    explained.add(symptom.id)
                    union(cause.id, symptom.id)
    uploads = by_kind.get("checkpoint_upload", [])
    for i, a in enumerate(uploads):
        for b in uploads[i + 1 :]:
            if _shared_storage(a, b, tolerance_s):
                union(a.id, b.id)
    components: dict[int, list[IncidentAlert]] = {}
    for alert in ordered:
        components.setdefault(find(alert.id), []).append(alert)
    groups = []
    for first in sorted(components):
        members = components[first]
        root, candidates = _root(members, explained)
        groups.append(Group(tuple(a.id for a in members), root, tuple(candidates)))
    return groups


def place(groups: Sequence[Group], incident_of: Mapping[int, int]) -> list[Placement]:
    """Where each group's alerts that are in no incident yet (`incident_of`: alert id →
    incident id, for the alerts already in one) go: the oldest (smallest id) incident among
    the group's alerts, or a new one. Groups with nothing new are left out."""
    placements = []
    for group in groups:
        joining = tuple(a for a in group.members if a not in incident_of)
        if not joining:
            continue
        existing = sorted({incident_of[a] for a in group.members if a in incident_of})
        placements.append(Placement(existing[0] if existing else None, group, joining))
    return placements


def gpu_hours_lost(alerts: Iterable[IncidentAlert]) -> float:
    """GPU-hours an incident's alerts cost so far, from their own evidence: a straggler or a
    slow fabric costs `gpu_hours_lost_per_hour` (every rank waits for it) from when its
    alert opened until the last pass that saw it; a hang costs its `gpu_hours_idle` (the
    run's world size × the stall). Stragglers of one run overlap (the slowest rank gates
    every collective), so only the costliest of them counts. Other kinds cost nothing of
    their own: they cost through the symptoms they cause."""
    stragglers: dict[str | None, float] = {}
    total = 0.0
    for alert in alerts:
        cost = _cost(alert)
        if alert.kind == "straggler":
            stragglers[alert.run] = max(stragglers.get(alert.run, 0.0), cost)
        else:
            total += cost
    return round(total + sum(stragglers.values()), 3)


def _cost(alert: IncidentAlert) -> float:
    evidence = alert.evidence
    idle = evidence.get("gpu_hours_idle")
    if alert.kind == "hang" and isinstance(idle, int | float):
        return max(float(idle), 0.0)
    rate = evidence.get("gpu_hours_lost_per_hour")
    if not isinstance(rate, int | float) or alert.last_seen is None:
        return 0.0
    return max(float(rate), 0.0) * max(alert.last_seen - alert.opened_at, 0.0) / 3600
