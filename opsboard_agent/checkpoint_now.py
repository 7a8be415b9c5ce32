""" "Checkpoint now": requests (an operator's command, or the program's own) wait here until
a step boundary where every rank saves, at one step agreed through the job's own store.

Rank 0 holds the requests. A step where nothing is pending costs the training loop two
attribute reads: no collective, no store call, no host sync. The agreement runs only when
rank 0 has a request, through torch.distributed's store (the TCPStore torchrun already
runs; each rank talks to it on a connection of its own, a `clone()`, from a daemon thread):

1. rank 0 opens round n (one key) at a boundary;
2. every rank's watcher thread, blocked on that key, raises the rank's fence and reports
   the last boundary its loop can pass before it sees the fence (its last boundary + one
   period, or the exact boundary where the loop stopped);
3. rank 0's watcher waits for all reports and publishes the target: their maximum;
4. a rank's loop that meets the fence before the target is known waits for it (only here,
   only while a request is pending); every rank saves at the target.

No rank can pass the target before knowing it, so every rank saves the same step, whatever
its skew to the others, and no rank waits in a collective for another: the watchers answer
even while their loops sit in the training's own all-reduce. A rank that never answers (its
loop never called `checkpoint_requested`, or it died) lets the round abort after
`AGREE_TIMEOUT_S`: nobody saves and rank 0 fails the commands naming the ranks. Every rank
must call `checkpoint_requested` at every step, including one whose reporter is off.

Without torch.distributed (or a lone rank) rank 0 answers itself at once. A job of several
ranks without a process group cannot agree: its requests are answered "no" and the
commands fail with that reason (`unagreeable`), instead of rank 0 saving alone. torch is
only looked up in sys.modules, never imported: the agent runs without it.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from opsboard_agent.checkpoint_round import Round, RoundStore
from opsboard_agent.commands import Command

NO_GROUP = (
    "this job has {world} ranks but no torch.distributed process group: the ranks cannot "
    "agree on a step, so none saves"
)
# How long rank 0 waits for every rank's report before the round aborts (seconds)
AGREE_TIMEOUT_S = float(os.environ.get("OPSBOARD_CHECKPOINT_AGREE_TIMEOUT_S", "60"))


class CheckpointRequests:
    """Pending requests of one rank; `None` stands for a local request (nothing to ack)."""

    def __init__(self, sync_every: int = 1, world_size: int = 1) -> None:
        self.sync_every = max(1, sync_every)
        self.world_size = world_size
        self.agreed_step: int | None = None  # the last step the ranks agreed to save at
        self._lock = threading.Lock()
        self._wanted: list[Command | None] = []
        self._round: Round | None = None
        self.aborted: list[tuple[str, list[Command | None]]] = []  # rank 0: (why, requests)

    @property
    def store_calls(self) -> int:
        """Store calls this rank's training loop made (the agreement's cost, for tests and
        benchmarks; its watcher thread's calls are not counted)."""
        return self._round.loop_calls if self._round else 0

    def add(self, command: Command | None) -> None:
        with self._lock:
            self._wanted.append(command)

    def _take(self) -> list[Command | None]:
        if not self._wanted:  # the common case, read without the lock: add() only appends
            return []
        with self._lock:
            wanted, self._wanted = self._wanted, []
        return wanted

    def boundary(self, step: int, *, rank: int) -> tuple[int | None, list[Command | None]]:
        """At `step` (every rank, every step): the step the ranks agreed to save at, or None,
        and (on rank 0) the requests this save answers. Only steps divisible by
        `sync_every` are boundaries."""
        if step % self.sync_every:
            return None, []
        if self._round is not None:
            return self._in_round(step, rank)
        dist = _distributed()
        if dist is None or dist.get_world_size() < 2:
            if self.world_size > 1:
                return None, []  # rank 0 fails its requests: see `unagreeable`
            wanted = self._take() if rank == 0 else []
            if not wanted:
                return None, []
            self.agreed_step = step
            return step, wanted
        if self._round is None:
            store = RoundStore.of_job(dist, timeout_s=AGREE_TIMEOUT_S)
            self._round = Round(store, rank=rank, world=dist.get_world_size(),
                                period=self.sync_every, step=step)  # fmt: skip
        return self._in_round(step, rank)

    def _in_round(self, step: int, rank: int) -> tuple[int | None, list[Command | None]]:
        assert self._round is not None
        saved, answered, aborted = self._round.boundary(step, self._take if rank == 0 else None)
        if aborted is not None:
            self.aborted.append(aborted)
        if saved is None:
            return None, []
        self.agreed_step = saved
        return saved, answered

    def unagreeable(self) -> tuple[str, list[Command | None]] | None:
        """(why, the requests) when this job cannot agree on a step: several ranks and no
        process group, or a round that aborted. The requests are dropped: the caller fails
        them."""
        if self.aborted:
            return self.aborted.pop(0)
        if self._round is not None or self.world_size < 2 or _distributed() is not None:
            return None
        wanted = self._take()
        return (NO_GROUP.format(world=self.world_size), wanted) if wanted else None

    def close(self) -> None:
        if self._round is not None:
            self._round.close()


def _distributed() -> Any:
    """torch.distributed when the job initialised it, else None."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None)
    if torch is None or dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist
