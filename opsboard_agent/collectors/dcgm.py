"""What dcgm-exporter's fields mean in the contract's core vocabulary.

Field names are those of dcgm-exporter's counters CSVs (etc/default-counters.csv,
etc/dcp-metrics-included.csv) and its old 1.x names (etc/1.x-compatibility-metrics.csv)."""

from __future__ import annotations

MIB = 1024 * 1024

# DCGM field (as exported) → (core metric, factor to the core unit). Needs a `gpu` label.
CORE_FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("gpu.util", 1.0),
    "DCGM_FI_DEV_FB_USED": ("gpu.mem_used_bytes", MIB),
    "DCGM_FI_DEV_FB_TOTAL": ("gpu.mem_total_bytes", MIB),
    "DCGM_FI_DEV_GPU_TEMP": ("gpu.temp_c", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("gpu.power_w", 1.0),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("gpu.power_limit_w", 1.0),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("gpu.power_limit_w", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("gpu.sm_clock_mhz", 1.0),
    # Renamed in DCGM 3.3; older exporters still send the first name.
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("gpu.throttle_reasons", 1.0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("gpu.throttle_reasons", 1.0),
    # The profiling NVLink fields are already rates in bytes per second.
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("gpu.nvlink_tx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("gpu.nvlink_rx_bytes_per_s", 1.0),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("gpu.ecc_corrected", 1.0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("gpu.ecc_uncorrected", 1.0),
    # dcgm-exporter 1.x names
    "dcgm_gpu_utilization": ("gpu.util", 1.0),
    "dcgm_fb_used": ("gpu.mem_used_bytes", MIB),
    "dcgm_gpu_temp": ("gpu.temp_c", 1.0),
    "dcgm_power_usage": ("gpu.power_w", 1.0),
    "dcgm_sm_clock": ("gpu.sm_clock_mhz", 1.0),
    "dcgm_ecc_sbe_volatile_total": ("gpu.ecc_corrected", 1.0),
    "dcgm_ecc_dbe_volatile_total": ("gpu.ecc_uncorrected", 1.0),
}

# "Value of the last XID error encountered": reported as `xid` events, not as a series.
XID_FIELDS = frozenset({"DCGM_FI_DEV_XID_ERRORS", "dcgm_xid_errors"})

# Volatile ECC counts also become `ecc` events when they grow.
ECC_KIND = {"gpu.ecc_corrected": "corrected", "gpu.ecc_uncorrected": "uncorrected"}

# Framebuffer in MiB; used to derive gpu.mem_total_bytes when FB_TOTAL is not exported
# (it is not in the default counters): total = free + used + reserved.
FB_PARTS = {
    "DCGM_FI_DEV_FB_FREE": "free",
    "DCGM_FI_DEV_FB_USED": "used",
    "DCGM_FI_DEV_FB_RESERVED": "reserved",
    "dcgm_fb_free": "free",
    "dcgm_fb_used": "used",
}

# Labels that identify the GPU, host or pod rather than a series of their own (the agent's
# batch already names the node, and `gpu` becomes the sample's `gpu`).
IDENTITY_LABELS = frozenset(
    {
        "gpu",
        "UUID",
        "uuid",
        "device",
        "modelName",
        "Hostname",
        "hostname",
        "pci_bus_id",
        "container",
        "namespace",
        "pod",
        "err_msg",
    }
)
# A MIG instance is a part of a GPU, not the GPU: its series are not the core per-GPU ones.
MIG_LABELS = frozenset({"GPU_I_ID", "GPU_I_PROFILE"})

# DCGM's "blank" sentinels (dcgm_structs.h): a field the GPU does not support or DCGM has no
# value for. INT64 ones are 0x7ffffffffffffff0..3, which become 2**63 as floats; INT32 ones
# are 0x7ffffff0..3; FP64 ones are 2**47..2**47+3.
_INT64_BLANK_FLOAT = float(0x7FFFFFFFFFFFFFF0)
_INT32_BLANKS = frozenset(float(0x7FFFFFF0 + i) for i in range(4))
_FP64_BLANKS = frozenset(float(2**47 + i) for i in range(4))


def is_dcgm_family(name: str) -> bool:
    return name.startswith(("DCGM_", "dcgm_"))


def is_blank(value: float) -> bool:
    """True for DCGM's blank/not-found/not-supported/not-permissioned sentinels."""
    return value >= _INT64_BLANK_FLOAT or value in _INT32_BLANKS or value in _FP64_BLANKS
