""" "Checkpoint now": requests (an operator's command, or the program's own) wait here until
the next step boundary, where the ranks agree on the step to save at.

Rank 0 holds the requests; at a boundary it broadcasts "save at this step" (or "no", -1)
through torch.distributed when it is initialised with more than one rank, so every rank
answers the same at the same step. torch is only looked up in sys.modules, never imported:
the agent runs without it."""

from __future__ import annotations

import sys
import threading

from opsboard_agent.commands import Command


class CheckpointRequests:
    """Pending requests of one rank; `None` stands for a local request (nothing to ack)."""

    def __init__(self, sync_every: int = 1) -> None:
        self.sync_every = max(1, sync_every)
        self.agreed_step: int | None = None  # the last step the ranks agreed to save at
        self._lock = threading.Lock()
        self._wanted: list[Command | None] = []

    def add(self, command: Command | None) -> None:
        with self._lock:
            self._wanted.append(command)

    def boundary(self, step: int, *, rank: int) -> tuple[int | None, list[Command | None]]:
        """At `step` (every rank, every step): the step the ranks agreed to save at, or None,
        and (on rank 0) the requests that this agreement answers. A collective when
        torch.distributed runs with more than one rank; only steps divisible by
        `sync_every` are boundaries."""
        if step % self.sync_every:
            return None, []
        wanted: list[Command | None] = []
        if rank == 0:
            with self._lock:
                wanted, self._wanted = self._wanted, []
        target = agree_from_rank0(step if wanted else -1)
        if target < 0:
            return None, []
        self.agreed_step = target
        return target, wanted


def agree_from_rank0(value: int) -> int:
    """`value` of rank 0 on every rank: a one-element broadcast when torch.distributed is
    initialised with more than one rank."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None)
    if torch is None or dist is None or not dist.is_available() or not dist.is_initialized():
        return value
    if dist.get_world_size() < 2:
        return value
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":  # NCCL broadcasts device tensors only
        device = torch.device("cuda", torch.cuda.current_device())
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.broadcast(tensor, src=0)
    return int(tensor.item())
