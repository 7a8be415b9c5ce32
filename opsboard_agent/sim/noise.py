"""Keyed, order-independent noise: the same (seed, key) always gives the same number.

The model draws every random value through these, keyed by what it describes (run, rank,
step, metric, sample time), so a value never depends on the order things were generated
in — advancing the model in one call or in a hundred gives bit-identical output.

`Noise` is the model's heavy-tailed noise (lognormal jitter, rare spikes, sensor jitter),
drawn through the same keyed functions.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from statistics import NormalDist

_SCALE = float(1 << 64)


def _digest(seed: int, key: tuple[object, ...], size: int) -> bytes:
    return hashlib.blake2b(repr((seed, *key)).encode(), digest_size=size).digest()


def unit(seed: int, *key: object) -> float:
    """Uniform in [0, 1)."""
    return int.from_bytes(_digest(seed, key, 8), "big") / _SCALE


def jitter(seed: int, *key: object) -> float:
    """Uniform in [-1, 1)."""
    return 2.0 * unit(seed, *key) - 1.0


def hexdigest(seed: int, *key: object) -> str:
    """32 hex characters (the format of `torchcheck`'s BLAKE2b checksums)."""
    return _digest(seed, key, 16).hex()


_NORMAL = NormalDist()
_EDGE = 1e-12  # keeps inv_cdf away from 0 and 1


def normal(seed: int, *key: object) -> float:
    """Standard normal (by the inverse CDF of a keyed uniform)."""
    return _NORMAL.inv_cdf(min(1.0 - _EDGE, max(_EDGE, unit(seed, *key))))


def lognormal(seed: int, cv: float, *key: object) -> float:
    """A lognormal factor with mean 1 and coefficient of variation `cv` (1.0 when cv = 0).

    Right-skewed like real step times: a step can take twice as long, never zero time."""
    if cv <= 0:
        return 1.0
    sigma2 = math.log1p(cv * cv)
    return math.exp(math.sqrt(sigma2) * normal(seed, *key) - sigma2 / 2)


@dataclass(frozen=True)
class Noise:
    """The heavy-tailed noise of a busy, shared cluster (off when `cv` and `spike_rate` are 0).

    - every rank's data, h2d and compute time of every step: an independent lognormal
      factor of coefficient of variation `cv`; the collective: `cv / 2` (one per step);
    - spikes: at a step, with probability `spike_rate`, one random rank of the run takes
      2-5x its compute time (a GC pause, pre-emption, a page-fault storm);
    - telemetry: GPU/host rates and utilisations jitter by `cv / 3`, temperatures by
      `10 * cv` degrees (sd), so sensors wobble but a healthy GPU does not look hot.
    """

    cv: float = 0.0
    spike_rate: float = 0.0
    spike_min: float = 2.0
    spike_max: float = 5.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.cv <= 2.0 and 0.0 <= self.spike_rate <= 1.0):
            raise ValueError("noise cv must be in [0, 2] and the spike rate in [0, 1]")
        if not 1.0 <= self.spike_min <= self.spike_max:
            raise ValueError("spikes must be 1 <= min <= max")

    @property
    def on(self) -> bool:
        return self.cv > 0 or self.spike_rate > 0

    def spike(self, seed: int, run: str, step: int, world: int) -> tuple[int, float] | None:
        """(rank, factor) of the spike in `run`'s `step`, if one happens there."""
        if self.spike_rate <= 0 or unit(seed, "spike", run, step) >= self.spike_rate:
            return None
        rank = int(unit(seed, "spike-rank", run, step) * world)
        share = unit(seed, "spike-size", run, step)
        return rank, self.spike_min + (self.spike_max - self.spike_min) * share

    def telemetry(self, seed: int, *key: object) -> float:
        """A multiplicative jitter of a telemetry reading (1.0 when off)."""
        return lognormal(seed, self.cv / 3, "telemetry", *key)

    def temperature(self, seed: int, *key: object) -> float:
        """An additive jitter of a temperature reading, in degrees (0.0 when off)."""
        return 10.0 * self.cv * normal(seed, "temperature", *key) if self.cv > 0 else 0.0
