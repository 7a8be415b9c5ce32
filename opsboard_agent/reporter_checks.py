"""The reporter's silent-data-corruption checks (opsboard_agent.torchcheck, which imports
torch: imported only when a check is called, so the agent runs without torch)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class CorruptionChecks:
    """Mixed into the Reporter: the values land in the next step report."""

    _pending: dict[str, Any]
    canary_projections: int
    canary_seed: int

    sample: Callable[..., None]  # the Reporter's

    def record_grad_checksum(self, model: Any) -> str:
        """Call after the gradients are all-reduced, before the optimizer step."""
        from opsboard_agent import torchcheck

        value = self._pending["grad_checksum"] = torchcheck.grad_checksum(model)
        return value

    def record_param_checksum(self, model: Any) -> str:
        """Call after the optimizer step."""
        from opsboard_agent import torchcheck

        value = self._pending["param_checksum"] = torchcheck.param_checksum(model)
        return value

    def record_canary(self, model: Any, loss_fn: Callable[[Any], Any]) -> dict[str, Any]:
        """Canary of the fixed probe batch (`loss_fn(module)` returns its loss); its cost is
        reported as the sample `agent.canary_seconds`."""
        from opsboard_agent import torchcheck

        started = time.perf_counter()
        value = torchcheck.canary(
            model, loss_fn, projections=self.canary_projections, seed=self.canary_seed
        )
        self._pending["canary"] = value
        self.sample("agent.canary_seconds", time.perf_counter() - started)
        return value
