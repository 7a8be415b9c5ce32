"""One rank's side of the checkpoint agreement's rounds (the protocol: checkpoint_now), and the
keys they use in the job's torch.distributed store."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)

ABORT = "abort:"
# The watcher waits this long on one call for rank 0 to open a round: torch logs a line at
# every timeout, so a long one (it only bounds how often an idle job logs)
IDLE_WAIT = timedelta(hours=24)

Taken = list[Any]  # rank 0's requests (commands, or None for a local one)
Aborted = tuple[str, Taken]


class RoundStore:
    """The agreement's keys under a prefix of the job's store: `loop` for the training
    loop's thread, `watch` (a clone: its own connection) for the watcher thread."""

    def __init__(self, loop: Any, watch: Any, timeout_s: float) -> None:
        self.loop, self.watch = loop, watch
        self.timeout = timedelta(seconds=timeout_s)

    @classmethod
    def of_job(cls, dist: Any, *, timeout_s: float) -> RoundStore:
        store = dist.distributed_c10d._get_default_store()
        # a restarted attempt of the job (torchrun's restarts share one store) starts afresh
        prefix = f"opsboard/checkpoint/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        return cls(
            dist.PrefixStore(prefix, store), dist.PrefixStore(prefix, store.clone()), timeout_s
        )

    # -- the training loop's thread
    def open(self, number: int) -> None:
        self.loop.set(f"{number}/open", "1")

    def target(self, number: int) -> tuple[int | None, str | None]:
        """Rank 0's target for the round (waits for it), or (None, why) when it aborted."""
        key = f"{number}/target"
        try:
            # rank 0 publishes within its own timeout; the margin covers its clock
            self.loop.wait([key], self.timeout + timedelta(seconds=30))
            value = self.loop.get(key).decode()
        except Exception as error:  # torch's store errors have no common public base
            return None, f"no step from rank 0 within {self.timeout.total_seconds():g} s: {error}"
        if value.startswith(ABORT):
            return None, value[len(ABORT) :]
        return int(value), None

    # -- the watcher thread
    def wait_open(self, number: int, closing: threading.Event) -> bool:
        """Blocks until rank 0 opens the round; False when the store went away or closing."""
        while not closing.is_set():
            try:
                self.watch.wait([f"{number}/open"], IDLE_WAIT)
                return True
            except Exception as error:
                if "timeout" not in str(error).lower():
                    log.debug("checkpoint agreement: the store went away: %s", error)
                    return False
        return False

    def report(self, number: int, rank: int, last_step: int) -> None:
        self.watch.set(f"{number}/at/{rank}", str(last_step))

    def publish(self, number: int, world: int) -> None:
        """Rank 0: the target once every rank reported (the highest step any rank may reach
        before it sees the fence), or why the round aborts."""
        keys = [f"{number}/at/{rank}" for rank in range(world)]
        try:
            self.watch.wait(keys, self.timeout)
            value = str(max(int(raw) for raw in self.watch.multi_get(keys)))
        except Exception:
            missing = [rank for rank, key in enumerate(keys) if not self.watch.check([key])]
            shown = ", ".join(map(str, missing[:20])) + (" …" if len(missing) > 20 else "")
            value = (
                f"{ABORT}rank {shown} did not take part within "
                f"{self.timeout.total_seconds():g} s (every rank must call "
                "checkpoint_requested at every step), so none saves"
            )
        self.watch.set(f"{number}/target", value)


class Round:
    """The agreement's rounds on one rank. The loop's thread calls `boundary`; a daemon
    watcher thread raises the fence and reports for this rank (and on rank 0 publishes)."""

    def __init__(self, store: RoundStore, *, rank: int, world: int, period: int, step: int):
        self.store, self.rank, self.world, self.period = store, rank, world, period
        self.last_boundary = step  # set before the watcher starts: it always has one
        self.number = 0  # the round the loop is in
        self.fence = -1  # the highest round the watcher saw opened
        self.target: int | None = None  # the current round's, once the loop knows it
        self.opened = False  # rank 0: the current round is open
        self.held: Taken = []  # rank 0: what the current round's save answers
        self.loop_calls = 0  # store calls made by the loop's thread
        self._closing = threading.Event()
        threading.Thread(target=self._watch, name="opsboard-checkpoint", daemon=True).start()

    def boundary(
        self, step: int, take: Callable[[], Taken] | None
    ) -> tuple[int | None, Taken, Aborted | None]:
        """(the step to save at now or None, rank 0's requests it answers, an aborted
        round's (why, requests)). Nothing pending: two attribute reads, no store call."""
        self.last_boundary = step
        if take is not None and not self.opened:
            wanted = take()
            if wanted:
                self.held, self.opened = wanted, True
                self.loop_calls += 1
                self.store.open(self.number)
        if self.fence < self.number:
            return None, [], None
        if self.target is None:
            self.loop_calls += 2
            target, why = self.store.target(self.number)
            if target is None:
                return None, [], self._finish(why or "aborted")
            self.target = target
        if step < self.target:
            return None, [], None
        if step > self.target:  # cannot happen: the fence stops every rank at the target
            return None, [], self._finish(f"rank {self.rank} passed step {self.target}")
        held = self.held
        self._finish(None)
        return step, held, None

    def _finish(self, why: str | None) -> Aborted | None:
        held = self.held
        self.number, self.target, self.opened, self.held = self.number + 1, None, False, []
        if why is None or self.rank != 0:
            return None
        log.warning("checkpoint agreement aborted: %s", why)
        return why, held

    def _watch(self) -> None:
        number = 0
        while self.store.wait_open(number, self._closing):
            self.fence = number
            # read after raising the fence: the loop stops at its next boundary at the latest
            self.store.report(number, self.rank, self.last_boundary + self.period)
            if self.rank == 0:
                self.store.publish(number, self.world)
            number += 1

    def close(self) -> None:
        self._closing.set()
