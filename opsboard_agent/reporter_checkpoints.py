"""The reporter's checkpoints: "checkpoint now" (the agreement: opsboard_agent.checkpoint_now)
and the `checkpoint` events of the loop's saves."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from opsboard_agent.checkpoint_now import CheckpointRequests
from opsboard_agent.commands import CommandPoller


class Checkpoints:
    """Mixed into the Reporter."""

    checkpoints: CheckpointRequests
    commands: CommandPoller | None
    rank: int

    event: Callable[..., None]  # the Reporter's

    def request_checkpoint(self) -> None:
        """Ask for a checkpoint at the next step boundary (on rank 0; e.g. from a signal
        handler); the same path as an operator's command, without the acks."""
        self.checkpoints.add(None)

    @property
    def checkpoint_step(self) -> int | None:
        """The last step the ranks agreed to save at."""
        return self.checkpoints.agreed_step

    def checkpoint_requested(self, step: int) -> bool:
        """True when the loop should save a checkpoint of `step` now. Every rank must call
        it at every step; it answers the same on all of them (free while nothing is
        pending). With `checkpoint_sync_every` N > 1, only steps divisible by N are
        boundaries. A rank whose reporter is disabled still takes part (else a round could
        not complete and would abort)."""
        refused = self.checkpoints.unagreeable()
        if refused is not None and self.commands is not None:
            why, commands = refused
            for command in commands:
                if command is not None:
                    self.commands.ack(command, "failed", why)
        target, answered = self.checkpoints.boundary(step, rank=self.rank)
        if target is None:
            return False
        for command in answered:
            if command is not None and self.commands is not None:
                self.commands.ack(command, "accepted", f"checkpoint at step {target}", step=target)
        return target == step

    def checkpoint(
        self,
        step: int,
        tier: str,
        state: str,
        *,
        path: str | None = None,
        size: int | None = None,
        duration: float | None = None,
    ) -> None:
        """One checkpoint event: `tier` is `local` or `durable`, `state` is `started`,
        `completed` or `failed`."""
        self.event(
            "checkpoint",
            step=step,
            tier=tier,
            state=state,
            path=path,
            bytes=size,
            duration=duration,
            rank=self.rank,
        )

    @contextlib.contextmanager
    def checkpointing(
        self, step: int, tier: str, *, path: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """`started` now, then `completed` (with duration, and `bytes` if the block sets
        `info["bytes"]`) or `failed` (the exception propagates)."""
        info: dict[str, Any] = {}
        self.checkpoint(step, tier, "started", path=path)
        started = time.perf_counter()
        try:
            yield info
        except BaseException:
            self.checkpoint(step, tier, "failed", path=path, duration=time.perf_counter() - started)
            raise
        self.checkpoint(
            step,
            tier,
            "completed",
            path=path,
            size=info.get("bytes"),
            duration=time.perf_counter() - started,
        )
