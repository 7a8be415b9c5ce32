"""Fault specs: `kind:key=value,...` from the command line, resolved against the layout.

    straggler:rank=5,at=60,factor=1.4     sdc:rank=3,mode=param,at=30
    input-bound:node=1,at=60,factor=1.0   hang:run=0,at=120
    oom-creep:rank=2,at=30,ramp=60        thermal:node=0,gpu=1,at=20,temp=92,ramp=60
    xid:node=1,gpu=0,at=45,code=79        node-loss:node=3,at=90
    nfs-drop:run=0,at=0,stall=60          fabric:run=0,at=30,factor=3,ramp=60
    resume:run=0,at=160,down=30,event=1

`resume`: the job crashes at `at` and is started again `down` seconds later from its newest
completed local checkpoint, so its step counter goes back; `event=1` sends the `restart`
event that `opsboard-agent supervise` sends, `event=0` leaves the server to infer it.

Subjects: `run` is a run's index or name (default: the first run, or the run of the named
node), `node` a node's index or name, `rank` a rank of the run, `gpu` a local GPU index.
A rank fault may name `node`+`gpu` instead of `rank`, and a GPU fault `rank` instead of
`node`+`gpu`. `at` is simulated seconds from the start (default 0). Unknown keys, unknown
kinds and subjects outside the layout are errors (`ValueError` with the reason).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from opsboard_agent.sim.layout import Layout, RankSlot

# What each kind is aimed at: a rank (and so its node and GPU), a GPU, a node, or a run.
SUBJECT = {
    "straggler": "rank",
    "sdc": "rank",
    "oom-creep": "rank",
    "thermal": "gpu",
    "xid": "gpu",
    "input-bound": "node",
    "node-loss": "node",
    "hang": "run",
    "nfs-drop": "run",
    "fabric": "run",
    "resume": "run",
}

# Parameters and their defaults; a default's type is the parameter's type.
DEFAULTS: dict[str, dict[str, float | int | str]] = {
    "straggler": {"factor": 1.4},
    "sdc": {"mode": "canary", "magnitude": 0.05},
    "oom-creep": {"ramp": 60.0},
    "thermal": {"temp": 92.0, "ramp": 60.0},
    "xid": {"code": 79},
    "input-bound": {"factor": 1.0},
    "node-loss": {},
    "hang": {},
    "nfs-drop": {"stall": 60.0},
    "fabric": {"factor": 3.0, "ramp": 60.0},
    "resume": {"down": 30.0, "event": 1},
}
SDC_MODES = ("canary", "param")
SUBJECT_KEYS = ("run", "node", "rank", "gpu")


@dataclass(frozen=True)
class Fault:
    """One injected fault: its kind, resolved subject, start (simulated s) and parameters."""

    kind: str
    at: float
    run: str | None = None
    node: str | None = None
    rank: int | None = None
    gpu: int | None = None
    params: Mapping[str, float | int | str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))

    def param(self, name: str) -> float:
        return float(self.params[name])

    def subject(self) -> dict[str, str | int]:
        """The subject as JSON: only the fields that apply to this kind."""
        values = {"run": self.run, "node": self.node, "rank": self.rank, "gpu": self.gpu}
        return {key: value for key, value in values.items() if value is not None}


def fault_parse(spec: str, layout: Layout) -> Fault:
    """One `--fault` value, resolved against `layout`."""
    kind, _, rest = spec.strip().partition(":")
    if kind not in SUBJECT:
        raise ValueError(f"unknown fault {kind!r}; one of {', '.join(SUBJECT)}")
    raw: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise ValueError(f"{spec!r}: {item!r} is not key=value")
        raw[key.strip()] = value.strip()
    allowed = {*SUBJECT_KEYS, "at", *DEFAULTS[kind]}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValueError(f"{spec!r}: unknown {', '.join(unknown)}; {kind} takes {sorted(allowed)}")
    at = _number(spec, "at", raw.pop("at", "0"), float)
    if at < 0:
        raise ValueError(f"{spec!r}: at must be >= 0")
    params = _params(spec, kind, raw)
    subject = {key: raw[key] for key in SUBJECT_KEYS if key in raw}
    return Fault(kind, at, params=params, **_resolve(spec, SUBJECT[kind], subject, layout))


def _number(spec: str, key: str, value: str, kind: type) -> float | int:
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{spec!r}: {key}={value!r} is not a number") from None


def _params(spec: str, kind: str, raw: Mapping[str, str]) -> dict[str, float | int | str]:
    params = dict(DEFAULTS[kind])
    for key, default in DEFAULTS[kind].items():
        if key in raw:
            if isinstance(default, str):
                params[key] = raw[key]
            else:
                params[key] = _number(spec, key, raw[key], type(default))
    for key in ("factor", "ramp", "stall", "magnitude", "down"):
        if key in params and not float(params[key]) > 0:
            raise ValueError(f"{spec!r}: {key} must be > 0")
    if kind == "resume" and params["event"] not in (0, 1):
        raise ValueError(f"{spec!r}: event must be 0 or 1")
    if kind == "sdc" and params["mode"] not in SDC_MODES:
        raise ValueError(f"{spec!r}: mode must be one of {', '.join(SDC_MODES)}")
    return params


def _resolve(
    spec: str, subject_kind: str, given: Mapping[str, str], layout: Layout
) -> dict[str, Any]:
    """Fill in the subject's fields from what the spec named."""
    node = _node(spec, given["node"], layout) if "node" in given else None
    if "run" in given:
        run = _run(spec, given["run"], layout)
    elif node is not None:
        run = layout.run_of_node(node).name
    else:
        run = layout.runs[0].name
    if subject_kind == "run":
        return {"run": run}
    if subject_kind == "node":
        if node is None and "rank" in given:
            node = _slot(spec, run, given, layout).node
        if node is None:
            raise ValueError(f"{spec!r}: name the node (node=INDEX|NAME)")
        return {"run": layout.run_of_node(node).name, "node": node}
    slot = _slot(spec, run, given, layout, node)
    return {"run": slot.run, "node": slot.node, "rank": slot.rank, "gpu": slot.gpu}


def _slot(
    spec: str, run: str, given: Mapping[str, str], layout: Layout, node: str | None = None
) -> RankSlot:
    if "rank" in given:
        rank = int(_number(spec, "rank", given["rank"], int))
        slots = layout.run(run).ranks
        if not 0 <= rank < len(slots):
            raise ValueError(f"{spec!r}: {run} has ranks 0..{len(slots) - 1}")
        return slots[rank]
    if node is not None and "gpu" in given:
        gpu = int(_number(spec, "gpu", given["gpu"], int))
        if not 0 <= gpu < layout.gpus:
            raise ValueError(f"{spec!r}: nodes have GPUs 0..{layout.gpus - 1}")
        return layout.slot_on(node, gpu)
    raise ValueError(f"{spec!r}: name rank=N, or node=N and gpu=N")


def _node(spec: str, value: str, layout: Layout) -> str:
    if value in layout.nodes:
        return value
    if value.isdigit() and int(value) < len(layout.nodes):
        return layout.nodes[int(value)]
    raise ValueError(f"{spec!r}: no node {value!r} (0..{len(layout.nodes) - 1} or a name)")


def _run(spec: str, value: str, layout: Layout) -> str:
    names = [run.name for run in layout.runs]
    if value in names:
        return value
    if value.isdigit() and int(value) < len(names):
        return names[int(value)]
    raise ValueError(f"{spec!r}: no run {value!r} (0..{len(names) - 1} or a name)")
