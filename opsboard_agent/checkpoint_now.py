""" "Checkpoint now": requests (an operator's command, or the program's own) wait here until
a step boundary, where the ranks agree on the step to save at.

Rank 0 holds the requests. At each boundary every rank takes part in one agreement, whether
its own reporter sends anything or not (a rank with no server or token still joins: if it
did not, the others would wait for it in the collective forever). The agreement is built
to cost the training loop nothing it would notice:

- it runs on a gloo process group of its own, on the CPU: no CUDA tensor, so no host sync of
  the GPU's stream (an NCCL broadcast read back with `.item()` stalled the loop every step);
- it is pipelined: at boundary k every rank reads the answer of the broadcast it posted at
  boundary k-1 (long finished by then) and posts boundary k's, asynchronously. Rank 0's
  value says "save at the boundary where this is read", so all ranks read the same answer
  at the same boundary and save at the same step, one boundary after rank 0 took the
  request.

Without torch.distributed (or a lone rank) rank 0 answers itself at once. A job of several
ranks without a process group cannot agree: its requests are answered "no" and the
commands fail with that reason (`unagreeable`), instead of rank 0 saving alone. torch is
only looked up in sys.modules, never imported: the agent runs without it.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from opsboard_agent.commands import Command

NO_GROUP = (
    "this job has {world} ranks but no torch.distributed process group: the ranks cannot "
    "agree on a step, so none saves"
)


class CheckpointRequests:
    """Pending requests of one rank; `None` stands for a local request (nothing to ack)."""

    def __init__(self, sync_every: int = 1, world_size: int = 1) -> None:
        self.sync_every = max(1, sync_every)
        self.world_size = world_size
        self.agreed_step: int | None = None  # the last step the ranks agreed to save at
        self._lock = threading.Lock()
        self._wanted: list[Command | None] = []
        self._agreement: _Agreement | None = None
        self.broadcasts = 0  # posted so far (the cost, for tests and benchmarks)

    def add(self, command: Command | None) -> None:
        with self._lock:
            self._wanted.append(command)

    def _take(self) -> list[Command | None]:
        with self._lock:
            wanted, self._wanted = self._wanted, []
        return wanted

    def boundary(self, step: int, *, rank: int) -> tuple[int | None, list[Command | None]]:
        """At `step` (every rank, every step): the step the ranks agreed to save at, or None,
        and (on rank 0) the requests this agreement answers. Only steps divisible by
        `sync_every` are boundaries."""
        if step % self.sync_every:
            return None, []
        dist = _distributed()
        if dist is None or dist.get_world_size() < 2:
            if self.world_size > 1:
                return None, []  # rank 0 fails its requests: see `unagreeable`
            wanted = self._take() if rank == 0 else []
            if not wanted:
                return None, []
            self.agreed_step = step
            return step, wanted
        if self._agreement is None:
            self._agreement = _Agreement(dist)  # collective: every rank, the same boundary
        answered = self._agreement.exchange(lambda: self._take() if rank == 0 else [])
        self.broadcasts += 1
        if answered is None:
            return None, []
        self.agreed_step = step
        return step, answered

    def unagreeable(self) -> tuple[str, list[Command | None]] | None:
        """(why, the requests) when this job cannot agree on a step: several ranks and no
        process group. The requests are dropped: the caller fails them."""
        if self.world_size < 2 or _distributed() is not None:
            return None
        wanted = self._take()
        return (NO_GROUP.format(world=self.world_size), wanted) if wanted else None


class _Agreement:
    """Rank 0's "save at the boundary where this is read", one boundary late, on a gloo
    group of its own: asynchronous broadcasts of one CPU integer."""

    def __init__(self, dist: Any) -> None:
        torch = sys.modules["torch"]
        self.dist, self.torch = dist, torch
        self.group = dist.new_group(backend="gloo")
        self.pending: tuple[Any, Any] | None = None  # (work, tensor) posted last boundary
        self.held: list[Command | None] = []  # rank 0: what the posted "save" answers

    def exchange(self, take: Any) -> list[Command | None] | None:
        """The requests the agreement read now answers (None: no save at this boundary);
        then the next boundary's value is posted."""
        answered = None
        if self.pending is not None:
            work, tensor = self.pending
            work.wait()
            if int(tensor[0]) == 1:
                answered, self.held = self.held, []
        wanted = take()
        self.held += wanted
        value = self.torch.tensor([1 if wanted else 0], dtype=self.torch.int64)
        work = self.dist.broadcast(value, src=0, group=self.group, async_op=True)
        self.pending = (work, value)
        return answered


def _distributed() -> Any:
    """torch.distributed when the job initialised it, else None."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None)
    if torch is None or dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist
