"""XID and ECC: driver-reported GPU errors, explained from a catalog.

The catalog (`data/xid_catalog.csv`, NVIDIA NVSentinel's XID mapping, Apache-2.0) gives each
code a mnemonic, a recommended action and FATAL/NONFATAL; fatal codes are critical.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

from detectors.common import node_runs, node_subject, unique_events
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.types import ClusterWindow, Finding

# The catalog's action codes in words.
ACTIONS = {
    "IGNORE": "no action needed",
    "RESTART_APP": "restart the application",
    "RESET_GPU": "drain the node and reset the GPU",
    "RESTART_VM": "restart the virtual machine",
    "RESTART_BM": "drain the node and reboot it (bare metal); replace the GPU if it recurs",
    "CHECK_MECHANICALS": "check the GPU's cooling and power delivery",
    "CHECK_UVM": "check the unified-memory (UVM) driver and the application's memory use",
    "UPDATE_SWFW": "update the GPU driver and firmware",
    "UNEXPECTED_ERR_REPORT_ISSUE": "unexpected error: collect a bug report and contact NVIDIA",
    "WORKFLOW_NVLINK_ERR": "check the NVLink fabric (nvidia-smi nvlink -e); reset the GPU",
    "WORKFLOW_NVLINK5_ERR": "check the NVLink fabric (nvidia-smi nvlink -e); reset the GPU",
    "WORKFLOW_XID_45": "usually follows another error: look for the XID before it",
    "WORKFLOW_XID_48": "drain the node, reset the GPU and check row remapping; replace it if "
    "the errors recur",
}
# Plain words for the codes seen most in training fleets; others derive from the mnemonic.
MEANINGS = {
    13: "graphics engine exception (often an application bug)",
    31: "GPU memory page fault (often an application bug)",
    43: "GPU stopped processing (the application hit an error)",
    45: "preemptive cleanup after an earlier error",
    48: "double-bit ECC error (DBE): uncorrectable GPU memory error",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
_ACRONYMS = {"gpu", "ecc", "dbe", "sbe", "nvlink", "mmu", "pmu", "gsp", "rpc", "fb", "ce", "c2c"}


@dataclass(frozen=True)
class Xid:
    code: int
    mnemonic: str
    meaning: str
    action_code: str
    action: str
    fatal: bool


def _words(code: int, mnemonic: str) -> str:
    text = mnemonic.strip().removeprefix("ROBUST_CHANNEL_")
    words = [w.upper() if w in _ACRONYMS else w for w in text.lower().split("_") if w]
    return " ".join(words) or f"XID {code} (unnamed in the catalog)"


@cache
def xid_catalog() -> dict[int, Xid]:
    """code → Xid, from the packaged CSV (no header; messy names are trimmed)."""
    text = resources.files("detectors").joinpath("data/xid_catalog.csv").read_text("utf-8")
    out = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) < 4 or not row[0].strip().isdigit():
            continue
        code, mnemonic, action_code, fatal = (c.strip() for c in row[:4])
        out[int(code)] = Xid(
            code=int(code),
            mnemonic=mnemonic,
            meaning=MEANINGS.get(int(code), _words(int(code), mnemonic)),
            action_code=action_code,
            action=ACTIONS.get(action_code, action_code),
            fatal=fatal.upper() == "FATAL",
        )
    return out


def xid_info(code: int) -> Xid:
    """The catalog's entry, or a non-fatal placeholder for a code it does not know."""
    return xid_catalog().get(code) or Xid(
        code,
        "",
        f"XID {code} (not in the catalog)",
        "",
        "look the code up in NVIDIA's XID table",
        False,
    )


def detect(
    window: ClusterWindow, now: float, config: DetectorConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """`xid` per (GPU, code) seen (`node:<n>/gpu:<g>/xid:<code>`; critical when fatal) and
    a critical `ecc` per GPU (`node:<n>/gpu:<g>`) with uncorrectable ECC errors, from `ecc`
    events or a rising uncorrectable-error counter."""
    runs_of = node_runs(window)
    found: dict[str, Finding] = {}
    counts: dict[str, int] = {}
    for _, event in unique_events(window, "xid"):
        code = int(event.data.get("code", -1))
        gpu = event.gpu if event.gpu is not None else event.data.get("gpu")
        info = xid_info(code)
        subject = f"{node_subject(event.node, gpu)}/xid:{code}"
        counts[subject] = counts.get(subject, 0) + 1
        first = found[subject].since if subject in found else event.ts
        where = f"GPU {gpu} of {event.node}" if gpu is not None else event.node
        found[subject] = Finding(
            kind="xid",
            subject=subject,
            severity="critical" if info.fatal else "warning",
            summary=f"{where} reported XID {code} ({info.meaning}): {info.action}",
            run=runs_of.get(event.node),
            node=event.node,
            gpu=gpu,
            evidence={
                "code": code,
                "mnemonic": info.mnemonic,
                "meaning": info.meaning,
                "recommended_action": info.action_code,
                "action": info.action,
                "fatal": info.fatal,
                "count": counts[subject],
                "last_at": event.ts,
                "message": str(event.data.get("message", ""))[:300],
            },
            since=first,
        )
    return list(found.values()) + _ecc(window, config, runs_of)


def _ecc(window: ClusterWindow, config: DetectorConfig, runs_of: dict[str, str]) -> list[Finding]:
    errors: dict[tuple[str, int | None], dict[str, float]] = {}
    for _, event in unique_events(window, "ecc"):
        # An event that says its errors were corrected is no emergency.
        if event.data.get("uncorrectable") is False or event.data.get("type") in (
            "corrected",
            "sbe",
        ):
            continue
        gpu = event.gpu if event.gpu is not None else event.data.get("gpu")
        entry = errors.setdefault((event.node, gpu), {"count": 0.0, "since": event.ts})
        entry["count"] += float(event.data.get("count", 1) or 1)
    for series in window.telemetry:
        node, gpu = series.node, series.gpu
        if series.metric in config.ecc_metrics and len(series) >= 2:
            values = series.values
            rise = (values[-1] - values[0]).item()
            if rise > 0:
                since = series.times[np.flatnonzero(values > values[0])[0]].item()
                entry = errors.setdefault((node, gpu), {"count": 0.0, "since": since})
                entry["count"] = max(entry["count"], rise)
                entry["since"] = min(entry["since"], since)
    findings = []
    for (node, gpu), entry in sorted(errors.items(), key=str):
        where = f"GPU {gpu} of {node}" if gpu is not None else node
        findings.append(
            Finding(
                kind="ecc",
                subject=node_subject(node, gpu),
                severity="critical",
                summary=(
                    f"{where} had {entry['count']:.0f} uncorrectable ECC error(s): drain the node "
                    "and reset the GPU"
                ),
                run=runs_of.get(node),
                node=node,
                gpu=gpu,
                evidence={"uncorrectable": entry["count"]},
                since=entry["since"],
            )
        )
    return findings
