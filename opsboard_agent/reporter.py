"""The training-loop reporter: one per rank, step reports and run events to the server.

    reporter = Reporter.from_env(run="llama-3")        # RANK/LOCAL_RANK/WORLD_SIZE, OPSBOARD_*
    for step, batch in enumerate(loader):
        with reporter.phase("data"): ...
        with reporter.phase("compute"): ...
        if reporter.should_check(step):
            reporter.record_grad_checksum(model)        # after all-reduce, before opt.step()
        ...
        reporter.step(step, tokens=n, loss=loss_value)
        if reporter.checkpoint_requested(step):         # every rank, every step
            save(...)                                   # inside reporter.checkpointing(...)
    reporter.close()                                    # run_end: finished

`close()` (and, if the program never calls it, an `atexit` hook) sends a `run_end` event:
`finished`, or `failed` when the interpreter exits on an uncaught exception or the reporter
is used as a context manager around a block that raises. A process killed outright sends
nothing: the server then sees the run's steps stop, and its `hang` detector speaks.

"Checkpoint now": rank 0 polls the server for its run's `checkpoint` commands in a
background thread. `checkpoint_requested(step)` is the step boundary at which the ranks
agree (opsboard_agent.checkpoint_now: through the job's torch.distributed store, only while
a request is pending), so every rank answers True at the same step; rank 0 then acks the
command `accepted` with that step. Saving and its `checkpoint` events stay the loop's.

Guarantees: `step()` and the phase timers only touch memory (a lock and a list append);
a background thread spools records every `flush_interval` seconds and another sends them,
so the training loop never waits on the disk or the network. Without a server configured
the reporter is disabled (one log line) and every call is a cheap no-op.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opsboard_agent.checkpoint_now import CheckpointRequests
from opsboard_agent.commands import CommandClient, CommandPoller
from opsboard_agent.process import ExitState, env_int, node_gpu
from opsboard_agent.records import Event, sample, sanitize_name
from opsboard_agent.reporter_checkpoints import Checkpoints
from opsboard_agent.reporter_checks import CorruptionChecks
from opsboard_agent.sender import Sender
from opsboard_agent.shipper import Shipper
from opsboard_agent.spool import Spool

log = logging.getLogger(__name__)

OFF_WORDS = ("0", "off", "false", "no")
PHASE_FIELDS = {
    "data": "data_time",
    "h2d": "h2d_time",
    "compute": "compute_time",
    "comm": "comm_wait",
}


class _Phase:
    """A reusable timer: adds each `with` block's duration to its step field."""

    __slots__ = ("_times", "_field", "_started")

    def __init__(self, times: dict[str, float], field: str) -> None:
        self._times, self._field, self._started = times, field, 0.0

    def __enter__(self) -> _Phase:
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._times[self._field] += time.perf_counter() - self._started


class Reporter(Checkpoints, CorruptionChecks):
    def __init__(
        self,
        *,
        run: str,
        server: str | None = None,
        token: str | None = None,
        node: str | None = None,
        rank: int = 0,
        local_rank: int = -1,  # -1: not known (LOCAL_RANK not set)
        world_size: int = 1,
        check_every: int = 100,
        shard: str | None = None,
        spool_dir: str | Path | None = None,
        spool_max_mb: float = 64.0,
        flush_interval: float = 1.0,
        canary_projections: int = 4,
        canary_seed: int = 0,
        commands: bool | None = None,
        checkpoint_sync_every: int = 1,
    ) -> None:
        self.run = sanitize_name(run)
        self.node = sanitize_name(node or socket.gethostname())
        self.rank, self.local_rank, self.world_size = rank, local_rank, world_size
        self.check_every, self.shard = check_every, shard
        self.canary_projections, self.canary_seed = canary_projections, canary_seed
        self._times = dict.fromkeys(PHASE_FIELDS.values(), 0.0)
        self._phases = {name: _Phase(self._times, field) for name, field in PHASE_FIELDS.items()}
        self._pending: dict[str, Any] = {}
        self._last_step_at: float | None = None
        self._cuda_gpu: int | None = None
        self.shipper: Shipper | None = None
        self.commands: CommandPoller | None = None
        self.checkpoints = CheckpointRequests(
            sync_every=checkpoint_sync_every, world_size=world_size
        )
        if not server or not token:
            log.warning("opsboard reporter disabled: no server or token configured")
            return
        spool_dir = (
            Path(spool_dir)
            if spool_dir
            else Path(tempfile.gettempdir())
            / "opsboard-agent"
            / f"{self.node}-{self.run}-rank{rank}"
        )
        spool = Spool(spool_dir, max_bytes=int(spool_max_mb * 1024 * 1024))
        sender = Sender(spool, server=server, token=token)
        self.shipper = Shipper(spool=spool, sender=sender, node=self.node, run=self.run)
        self.shipper.start(flush_interval=flush_interval)
        # A program that never calls close() still ends its run (failed on an uncaught
        # exception); close() unregisters this.
        ExitState.install()
        atexit.register(self._at_exit)
        restarts = env_int("TORCHELASTIC_RESTART_COUNT", 0)
        if restarts > 0 and rank == 0:
            self.event("restart", restart_count=restarts, rank=rank)
        if commands is None:
            # On unless turned off: a held poll costs the server a coroutine on its ASGI
            # server, and this side a daemon thread that backs off while no server answers.
            commands = os.environ.get("OPSBOARD_COMMANDS", "on").lower() not in OFF_WORDS
        if commands and rank == 0:
            self.commands = CommandPoller(
                CommandClient(server=server, token=token),
                node=self.node,
                run=self.run,
                kinds=("checkpoint",),
                handle=self.checkpoints.add,
            ).start()

    @classmethod
    def from_env(cls, *, run: str | None = None, **kwargs: Any) -> Reporter:
        """A reporter configured from torchrun's RANK/LOCAL_RANK/WORLD_SIZE and
        OPSBOARD_SERVER, OPSBOARD_TOKEN_FILE, OPSBOARD_NODE, OPSBOARD_RUN,
        OPSBOARD_SPOOL_DIR (a per-rank subdirectory is used); keyword arguments win."""
        rank = kwargs.pop("rank", env_int("RANK", 0))
        token = kwargs.pop("token", None)
        token_file = kwargs.pop("token_file", None) or os.environ.get("OPSBOARD_TOKEN_FILE")
        if token is None and token_file:
            token = Path(token_file).read_text().strip()
        spool_dir = kwargs.pop("spool_dir", None)
        if spool_dir is None and os.environ.get("OPSBOARD_SPOOL_DIR"):
            spool_dir = Path(os.environ["OPSBOARD_SPOOL_DIR"]) / f"rank-{rank}"
        return cls(
            run=run or os.environ.get("OPSBOARD_RUN") or "run",
            server=kwargs.pop("server", None) or os.environ.get("OPSBOARD_SERVER"),
            token=token,
            node=kwargs.pop("node", None) or os.environ.get("OPSBOARD_NODE"),
            rank=rank,
            local_rank=kwargs.pop("local_rank", env_int("LOCAL_RANK", -1)),
            world_size=kwargs.pop("world_size", env_int("WORLD_SIZE", 1)),
            spool_dir=spool_dir,
            **kwargs,
        )

    @property
    def enabled(self) -> bool:
        return self.shipper is not None

    # -- the step ------------------------------------------------------------------------

    def phase(self, name: str) -> _Phase:
        """Timer for one of `data`, `h2d`, `compute`, `comm`; blocks add up within a step."""
        return self._phases[name]

    def should_check(self, step: int) -> bool:
        return self.check_every > 0 and step % self.check_every == 0

    def step(
        self,
        step: int,
        *,
        tokens: int | None = None,
        loss: Any = None,
        step_time: float | None = None,
        ts: float | None = None,
        **fields: Any,
    ) -> None:
        """Record the step report of this rank: the phase times since the previous
        `step()`, the corruption checks recorded since, and `fields` (explicit phase times
        win over the timers). `step_time` defaults to the wall time since the previous call
        (the phase sum for the first); `ts` to now (the simulator passes simulated time). A
        tensor `loss` is read with `.item()`, which synchronises with the device."""
        now = time.perf_counter()
        times = self._times
        if step_time is None:
            step_time = (
                (now - self._last_step_at)
                if self._last_step_at is not None
                else sum(times.values())
            )
        self._last_step_at = now
        record: dict[str, Any] = {
            "ts": time.time() if ts is None else ts,
            "rank": self.rank,
            "step": step,
            "step_time": step_time,
        }
        for field, value in times.items():
            if value:
                record[field] = value
            times[field] = 0.0
        if tokens is not None:
            record["tokens"] = int(tokens)
        if loss is not None:
            loss = float(loss.item() if hasattr(loss, "item") else loss)
            if loss == loss and abs(loss) != float("inf"):  # a NaN loss must not cost the batch
                record["loss"] = loss
        shard = self.reported_shard
        if shard is not None:
            record["shard"] = shard
        gpu = self._gpu()
        if gpu is not None:
            record["gpu"] = gpu
        if self._pending:
            record.update(self._pending)
            self._pending = {}
        record.update(fields)
        if self.shipper is not None:
            self.shipper.add(steps=(record,))

    def _gpu(self) -> int | None:
        """The rank's GPU index on its node: the current CUDA device once torch has
        initialised CUDA (fixed from then on), else LOCAL_RANK (None when not set)."""
        if self._cuda_gpu is None:
            torch = sys.modules.get("torch")  # never imported here: only if the job did
            cuda = getattr(torch, "cuda", None)
            if cuda is not None and cuda.is_initialized():
                self._cuda_gpu = node_gpu(cuda.current_device())
        return self._cuda_gpu if self._cuda_gpu is not None else node_gpu(self.local_rank)

    # -- events and samples --------------------------------------------------------------

    def event(self, kind: str, *, ts: float | None = None, **fields: Any) -> None:
        """Record an event of the contract (`ts` defaults to now)."""
        record: Event = {
            "ts": time.time() if ts is None else ts,
            "kind": kind,
            **{k: v for k, v in fields.items() if v is not None},
        }
        if self.shipper is not None:
            self.shipper.add(events=(record,))

    def sample(
        self, metric: str, value: float, gpu: int | None = None, *, ts: float | None = None
    ) -> None:
        record = sample(time.time() if ts is None else ts, metric, value, gpu)
        if record is not None and self.shipper is not None:
            self.shipper.add(samples=(record,))

    @contextlib.contextmanager
    def oom_guard(self) -> Iterator[None]:
        """Reports `torch.cuda.OutOfMemoryError` (where torch has it) as an `oom` event,
        spools it at once (the process is likely about to die), and re-raises."""
        torch = sys.modules.get("torch")
        oom_type = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
        if oom_type is None:
            yield
            return
        try:
            yield
        except oom_type as exc:
            self.event("oom", rank=self.rank, message=str(exc)[:8000])
            if self.shipper is not None:
                self.shipper.flush()
            raise

    def restart(self, **fields: Any) -> None:
        self.event("restart", rank=self.rank, **fields)

    def close(
        self,
        drain_timeout: float = 10.0,
        *,
        state: str | None = "finished",
        message: str | None = None,
    ) -> None:
        """Send a `run_end` event (`state` finished or failed, an optional `message`; None
        sends none, e.g. for a process that hands the run on), spool what is buffered and
        deliver for up to `drain_timeout` seconds. Later calls do nothing."""
        self.checkpoints.close()
        if self.shipper is None:
            return
        atexit.unregister(self._at_exit)
        if self.commands is not None:
            self.commands.stop()
            self.commands = None
        if state is not None:
            if state not in ("finished", "failed"):
                raise ValueError(f"a run ends finished or failed, not {state!r}")
            self.event("run_end", state=state, rank=self.rank, message=message)
        self.shipper.close(drain_timeout=drain_timeout)
        self.shipper = None

    def _at_exit(self) -> None:
        failure = ExitState.failure
        self.close(state="failed" if failure else "finished", message=failure)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: Any, tb: Any) -> None:
        """Ends the run: failed when the block raised (KeyboardInterrupt included)."""
        if kind is None:
            self.close()
        else:
            self.close(state="failed", message=f"{kind.__name__}: {value}"[:8000])
