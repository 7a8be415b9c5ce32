"""The reporter's silent-data-corruption checks (opsboard_agent.torchcheck, which imports
torch: imported only when a check is called, so the agent runs without torch)."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any


class CorruptionChecks:
    """Mixed into the Reporter: the values land in the next step report.

    The checks digest and probe the rank's own shard (opsboard_agent.torchshard), and the
    first check of a model derives its shard key, sent from then on as the reports'
    `shard` unless the Reporter was given one."""

    _pending: dict[str, Any]
    canary_projections: int
    canary_seed: int
    shard: str | None

    sample: Callable[..., None]  # the Reporter's

    # The key derived from the model last checked, and that model (weakly: the reporter
    # must not keep a model alive). Derived once per model, not per check.
    derived_shard: str | None = None
    _shard_model: weakref.ref[Any] | None = None

    @property
    def reported_shard(self) -> str | None:
        """The step reports' `shard`: the one given to the Reporter, else the derived one."""
        return self.shard if self.shard is not None else self.derived_shard

    def record_grad_checksum(self, model: Any) -> str:
        """Call after the gradients are all-reduced, before the optimizer step."""
        from opsboard_agent import torchcheck, torchshard

        self._derive_shard(model)
        value = self._pending["grad_checksum"] = torchcheck.grad_checksum(
            torchshard.local_view(model)
        )
        return value

    def record_param_checksum(self, model: Any) -> str:
        """Call after the optimizer step."""
        from opsboard_agent import torchcheck, torchshard

        self._derive_shard(model)
        value = self._pending["param_checksum"] = torchcheck.param_checksum(
            torchshard.local_view(model)
        )
        return value

    def record_canary(self, model: Any, loss_fn: Callable[[Any], Any]) -> dict[str, Any]:
        """Canary of the fixed probe batch (`loss_fn(module)` returns its loss); its cost is
        reported as the sample `agent.canary_seconds`. Under FSDP every rank must call it at
        the same step (the probe unshards the model: torchshard.canary_view)."""
        from opsboard_agent import torchcheck, torchshard

        self._derive_shard(model)
        started = time.perf_counter()
        with torchshard.canary_view(model, loss_fn) as (module, probe_loss):
            value = torchcheck.canary(
                module, probe_loss, projections=self.canary_projections, seed=self.canary_seed
            )
        self._pending["canary"] = value
        self.sample("agent.canary_seconds", time.perf_counter() - started)
        return value

    def _derive_shard(self, model: Any) -> None:
        if self.shard is not None:
            return  # given: nothing to derive
        if self._shard_model is not None and self._shard_model() is model:
            return
        from opsboard_agent import torchshard

        self.derived_shard = torchshard.shard_key(model)
        self._shard_model = weakref.ref(model)
