"""Node telemetry of the model: the core GPU and host metrics of the contract at one time.

Values follow the run's state (`ClusterModel.run_state`) and the expected step split:
a training GPU is busy while it computes or sits in a collective, idle while its rank waits
for data; a hung run's GPUs spin in NCCL kernels (100 % "util", low power); a crashed run's
GPUs are idle with their memory freed. Faults: `oom-creep` (memory climbs to the total),
`thermal` (temperature, throttle bits, SM clock), `input-bound` (CPU and disk reads up).
With the model's noise on, readings also jitter (`noise.Noise.telemetry` / `.temperature`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from opsboard_agent.sim.faults import Fault
from opsboard_agent.sim.layout import Layout, RankSlot
from opsboard_agent.sim.noise import Noise, jitter

GPU_MODEL = "NVIDIA H100 80GB HBM3"
GPU_MEM_TOTAL = 80 * 2**30
GPU_MEM_SHARE = 0.78  # of the total, held by a training process
GPU_MEM_IDLE = 512 * 2**20
POWER_LIMIT_W, POWER_IDLE_W, POWER_BUSY_W = 700.0, 72.0, 660.0
IDLE_SM_CLOCK_MHZ = 345.0
IDLE_TEMP_C, HUNG_TEMP_C = 34.0, 52.0
NVLINK_BYTES_PER_S = 4.5e10
# NVML clocks-event (throttle) reasons.
GPU_IDLE = 0x1
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40

HOST_CPUS = 192
HOST_MEM_TOTAL = 2 * 2**40
HOST_NET_BYTES_PER_S = 1.2e10
HOST_DISK_READ_BYTES_PER_S, INPUT_BOUND_DISK_READ_BYTES_PER_S = 4.0e8, 2.4e9
CKPT_WRITE_BYTES_PER_S = 6.0e9


@dataclass(frozen=True)
class SimSample:
    t: float
    node: str
    metric: str
    value: float
    gpu: int | None = None


class _NoiseConfig(Protocol):
    @property
    def noise(self) -> Noise: ...


class TelemetrySource(Protocol):
    """What telemetry reads of `model.ClusterModel`, which imports this module (so the
    imports run one way: model → telemetry)."""

    @property
    def layout(self) -> Layout: ...
    @property
    def seed(self) -> int: ...
    @property
    def config(self) -> _NoiseConfig: ...
    def active(self, kind: str, t: float, **subject: object) -> Sequence[Fault]: ...
    def run_state(self, run: str, t: float) -> str: ...
    def expected_split(
        self, run: str, t: float
    ) -> tuple[dict[int, tuple[float, float, float]], float]: ...
    def gpu_temp(self, node: str, gpu: int, t: float, base: float = ...) -> float: ...
    def sm_clock(self, node: str, gpu: int, t: float, temp: float | None = None) -> float: ...
    def writing_checkpoint(self, run: str, t: float) -> bool: ...


def node_info(gpus: int) -> dict[str, object]:
    """The contract's `node_info` of a simulated node."""
    return {"gpus": gpus, "gpu_model": GPU_MODEL, "cpus": HOST_CPUS, "mem_bytes": HOST_MEM_TOTAL}


def node_samples(model: TelemetrySource, node: str, t: float) -> list[SimSample]:
    """Every GPU's and the host's samples of `node` at `t`."""
    run = model.layout.run_of_node(node)
    state = model.run_state(run.name, t)
    busy: dict[int, float] = {}
    if state == "training":
        split, step_time = model.expected_split(run.name, t)
        # Kernels run while a rank computes or waits in a collective, not while it waits
        # for data or copies it in.
        busy = {rank: 1.0 - (data + h2d) / step_time for rank, (data, h2d, _) in split.items()}
    out: list[SimSample] = []
    for slot in run.ranks:
        if slot.node == node:
            for metric, value in _gpu(model, slot, t, state, busy.get(slot.rank, 0.0)):
                out.append(SimSample(t, node, metric, value, slot.gpu))
    for metric, value in _host(model, node, run.name, len(run.nodes), t, state):
        out.append(SimSample(t, node, metric, value))
    return out


def _gpu(
    model: TelemetrySource, slot: RankSlot, t: float, state: str, busy: float
) -> list[tuple[str, float]]:
    noise = model.config.noise

    def wobble(name: str, amplitude: float) -> float:
        # The sensor's own wobble, times the noise model's jitter (1.0 when it is off).
        return (1.0 + amplitude * jitter(model.seed, "gpu", slot.node, slot.gpu, name, t)) * (
            noise.telemetry(model.seed, "gpu", slot.node, slot.gpu, name, t)
        )

    if state == "training":
        util = min(100.0, 100.0 * busy * wobble("util", 0.01))
        base_temp = 34.0 + 29.0 * busy
    elif state == "hung":
        util, base_temp = 100.0, HUNG_TEMP_C
    else:
        util, base_temp = 0.0, IDLE_TEMP_C
    temp = model.gpu_temp(slot.node, slot.gpu, t, base_temp) + 0.8 * jitter(
        model.seed, "gpu", slot.node, slot.gpu, "temp", t
    )
    temp += noise.temperature(model.seed, slot.node, slot.gpu, t)
    clock = model.sm_clock(slot.node, slot.gpu, t, temp) if util else IDLE_SM_CLOCK_MHZ
    throttle = GPU_IDLE if util < 5 else 0
    if temp > 85.0:
        throttle |= HW_THERMAL_SLOWDOWN | SW_THERMAL_SLOWDOWN
    power = POWER_IDLE_W
    if state == "training":
        power += (POWER_BUSY_W - POWER_IDLE_W) * util / 100 * clock / 1980.0
    elif state == "hung":
        power += 0.2 * (POWER_BUSY_W - POWER_IDLE_W)  # spinning, not computing
    power *= wobble("power", 0.02)
    nvlink = NVLINK_BYTES_PER_S * wobble("nvlink", 0.05) if state == "training" else 0.0
    return [
        ("gpu.util", util),
        ("gpu.mem_used_bytes", _memory(model, slot, t, state)),
        ("gpu.mem_total_bytes", float(GPU_MEM_TOTAL)),
        ("gpu.temp_c", temp),
        ("gpu.power_w", min(power, POWER_LIMIT_W)),
        ("gpu.power_limit_w", POWER_LIMIT_W),
        ("gpu.sm_clock_mhz", clock),
        ("gpu.throttle_reasons", float(throttle)),
        ("gpu.nvlink_tx_bytes_per_s", nvlink),
        ("gpu.nvlink_rx_bytes_per_s", nvlink),
    ]


def _memory(model: TelemetrySource, slot: RankSlot, t: float, state: str) -> float:
    """A training process holds ~78 %; `oom-creep` climbs linearly to the total at
    `at + ramp` (the OOM); a crashed run's GPUs hold almost nothing."""
    if state == "crashed":
        return float(GPU_MEM_IDLE)
    used = (
        GPU_MEM_TOTAL
        * GPU_MEM_SHARE
        * (1.0 + 0.002 * jitter(model.seed, "gpu", slot.node, slot.gpu, "mem", t))
    )
    for fault in model.active("oom-creep", t, run=slot.run, rank=slot.rank):
        share = min(1.0, (t - fault.at) / fault.param("ramp"))
        used += (GPU_MEM_TOTAL - used) * share
    return float(min(used, GPU_MEM_TOTAL))


def _host(
    model: TelemetrySource, node: str, run: str, run_nodes: int, t: float, state: str
) -> list[tuple[str, float]]:
    noise = model.config.noise

    def wobble(name: str, amplitude: float) -> float:
        return (1.0 + amplitude * jitter(model.seed, "host", node, name, t)) * noise.telemetry(
            model.seed, "host", node, name, t
        )

    training = state == "training"
    starved = training and bool(model.active("input-bound", t, node=node))
    cpu = 22.0 * wobble("cpu", 0.15) if training else 3.0 * wobble("cpu", 0.3)
    if starved:
        cpu = min(100.0, 96.0 * wobble("cpu", 0.03))
    net = HOST_NET_BYTES_PER_S * wobble("net", 0.05) if training and run_nodes > 1 else 2.0e6
    read = INPUT_BOUND_DISK_READ_BYTES_PER_S if starved else HOST_DISK_READ_BYTES_PER_S
    write = CKPT_WRITE_BYTES_PER_S if model.writing_checkpoint(run, t) else 2.0e7
    return [
        ("host.cpu_util", cpu),
        ("host.mem_used_bytes", HOST_MEM_TOTAL * 0.30 * wobble("mem", 0.01)),
        ("host.mem_total_bytes", float(HOST_MEM_TOTAL)),
        ("host.net_rx_bytes_per_s", net),
        ("host.net_tx_bytes_per_s", net * wobble("tx", 0.02)),
        ("host.disk_read_bytes_per_s", read * wobble("read", 0.1) if training else 1.0e6),
        ("host.disk_write_bytes_per_s", write * wobble("write", 0.05)),
    ]
