"""What each scraped sample becomes: a plan, decided once per series and reused every tick.

A contract sample has no labels, so the labels that tell series apart are folded into the
name (`node_cpu_seconds_total{cpu="0",mode="idle"}` → `...total.cpu_0.mode_idle`) and the
target's name goes in front (`node:...`). Counters become per-second rates computed by the
agent and get `.rate` at the end. DCGM fields that are core metrics become `gpu.*` with the
GPU index, unprefixed, exactly as the NVML collector would send them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from opsboard_agent.collectors import dcgm
from opsboard_agent.records import GPU_MAX, sanitize_metric
from opsboard_agent.targets import ScrapeTarget

DROPPED_LABELS = frozenset({"job", "instance"})
RATE_SUFFIX = ".rate"

GAUGE, RATE, CORE, XID = "gauge", "rate", "core", "xid"


@dataclass(frozen=True, slots=True)
class Plan:
    """How one exposed series is stored. `kind` is GAUGE or RATE (a series of its own), CORE
    (a DCGM field as a core metric, times `factor`) or XID (events only). `fb` names the
    framebuffer part a DCGM field contributes to the derived total; `dcgm` means DCGM's
    blank sentinels are dropped."""

    kind: str
    metric: str
    gpu: int | None = None
    factor: float = 1.0
    ecc: str | None = None
    fb: str | None = None
    dcgm: bool = False


def plan_for(family: Any, name: str, labels: dict[str, str], target: ScrapeTarget) -> Plan | None:
    """The plan for sample `name{labels}` of a parsed `family`, or None when it is not kept
    (info metrics, OpenMetrics `_created`, histogram buckets not allow-listed)."""
    kind = family.type
    if kind == "info" or (name.endswith("_created") and kind != "gauge"):
        return None
    labels = {k: v for k, v in labels.items() if v != "" and k not in DROPPED_LABELS}
    gpu_label = labels.get("gpu")
    gpu = int(gpu_label) if gpu_label is not None and gpu_label.isdigit() else None
    if gpu is not None and gpu > GPU_MAX:
        gpu = None  # not a GPU index the contract takes: the label stays in the name
    is_dcgm = dcgm.is_dcgm_family(family.name)
    fb = None
    if is_dcgm:
        if gpu is not None and not labels.keys() & dcgm.MIG_LABELS:
            if name in dcgm.XID_FIELDS:
                return Plan(XID, "xid", gpu, dcgm=True)
            fb = dcgm.FB_PARTS.get(name)
            if name in dcgm.CORE_FIELDS:
                metric, factor = dcgm.CORE_FIELDS[name]
                ecc = dcgm.ECC_KIND.get(metric)
                return Plan(CORE, metric, gpu, factor, ecc, fb, dcgm=True)
        labels = {
            k: v
            for k, v in labels.items()
            if k not in dcgm.IDENTITY_LABELS and not k.startswith("DCGM_FI_")
        }
    elif gpu is not None:
        labels.pop("gpu")
    if name == family.name + "_bucket" and not target.keeps_buckets(family.name):
        return None
    suffix = RATE_SUFFIX if is_counter(kind, family.name, name) else ""
    folded = "".join(f".{key}_{labels[key]}" for key in sorted(labels))
    metric = sanitize_metric(f"{target.name}:{name}{folded}", suffix=suffix)
    return Plan(RATE if suffix else GAUGE, metric, gpu, fb=fb, dcgm=is_dcgm)


def is_counter(kind: str, family: str, name: str) -> bool:
    """Cumulative series: counters, a histogram's or summary's `_sum`/`_count`/`_bucket`,
    and untyped series named like a counter (`_total`)."""
    if kind == "counter":
        return True
    if kind in ("histogram", "summary"):
        return name in (family + "_sum", family + "_count", family + "_bucket")
    return kind in ("unknown", "untyped") and name.endswith("_total")


def plans_for_samples(
    pairs: Iterable[tuple[Any, Any]], target: ScrapeTarget
) -> tuple[list[Plan | None], int]:
    """Plans for (family, sample) pairs in order, and how many were dropped as duplicates:
    the same series exposed twice, two fields mapped to one core metric (`POWER_MGMT_LIMIT`
    and `ENFORCED_POWER_LIMIT`), or two label sets that sanitise to one name. The first
    keeps the series, so it never has two values for one timestamp."""
    plans: list[Plan | None] = []
    seen: set[tuple[str, int | None]] = set()
    duplicates = 0
    for family, s in pairs:
        plan = plan_for(family, s.name, s.labels, target)
        if plan is not None:
            key = (plan.metric, plan.gpu)
            if key in seen:
                plan, duplicates = None, duplicates + 1
            else:
                seen.add(key)
        plans.append(plan)
    return plans, duplicates
