"""What a rank's step report says about its numbers: the loss curve, the checksums
(identical across replicas of a shard) and the canary (equal to ~1e-7 relative), with the
`sdc` faults applied. Pure functions of the seed and the step's coordinates."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from opsboard_agent.sim.faults import Fault
from opsboard_agent.sim.layout import RankSlot
from opsboard_agent.sim.noise import hexdigest, jitter

CANARY_PROJECTIONS = 4
CANARY_JITTER = 1e-7  # healthy GPUs agree to ~1e-7 relative (reduction order)


def step_loss(seed: int, run: str, rank: int, step: int) -> float:
    floor = 1.9 + 0.2 * (jitter(seed, "floor", run) + 1) / 2
    decayed = floor + (10.4 - floor) * math.exp(-step / 400.0)
    return decayed * (1.0 + 0.02 * jitter(seed, "loss", run, rank, step))


def step_checks(seed: int, slot: RankSlot, step: int, sdc: Iterable[Fault]) -> dict[str, Any]:
    """The checksums and canary of `slot`'s `step`; `sdc`: the sdc faults active on it."""
    sdc = list(sdc)
    run, shard, rank = slot.run, slot.shard, slot.rank
    param = hexdigest(seed, "param", run, shard, step)
    if any(f.params["mode"] == "param" for f in sdc):
        param = hexdigest(seed, "param-flipped", run, rank, step)
    norm = 3.0 * (1.0 + 0.2 * jitter(seed, "norm", run, shard, step))
    proj = [2.0 * jitter(seed, "proj", run, shard, step, i) for i in range(CANARY_PROJECTIONS)]
    norm *= 1.0 + CANARY_JITTER * jitter(seed, "cn", run, rank, step)
    proj = [
        p * (1.0 + CANARY_JITTER * jitter(seed, "cp", run, rank, step, i))
        for i, p in enumerate(proj)
    ]
    for fault in sdc:
        if fault.params["mode"] == "canary":
            magnitude = fault.param("magnitude")
            norm *= 1.0 + magnitude
            proj = [
                p + magnitude * norm * (1.0 + jitter(seed, "sdc", run, rank, step, i))
                for i, p in enumerate(proj)
            ]
    return {
        "grad_checksum": hexdigest(seed, "grad", run, shard, step),
        "param_checksum": param,
        "canary": {"norm": norm, "proj": proj},
    }
