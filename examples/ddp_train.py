"""A small DistributedDataParallel training job that reports through opsboard_agent.

    torchrun --standalone --nproc-per-node 4 examples/ddp_train.py \
        --server http://127.0.0.1:8000 --token-file token --run demo --steps 200

Runs on CPUs (gloo). The gradient all-reduce is done explicitly after a `no_sync()`
backward, rather than inside DDP's backward, so that the time blocked in the collective is
measurable as `comm_wait` (inside DDP's backward it would be counted as compute, and a slow
rank would make every rank look slow). DDP still broadcasts the initial weights.

Fault hooks, for tests of the server's detectors:
  --straggler-rank R --straggler-sleep S   rank R sleeps S seconds in its compute phase
  --straggler-rank R --straggler-repeat N  rank R runs forward and backward N times per step
                                           (it computes more: the same gradients, N x work)
  --hidden H                               the hidden layer's width (a wider model makes
                                           compute, not overhead, the bulk of a step)
  --perturb-grad-rank R                    rank R's local gradients are scaled by 1+1e-3
                                           (its canary disagrees; all-reduce hides the rest)
  --flip-param-rank R --flip-param-step K  rank R flips one bit of one weight at step K
                                           (its param checksum disagrees from then on)
  --step-sleep S                           every rank sleeps S seconds per step (a slow job)

Operator commands: when an operator asks for a checkpoint, `reporter.checkpoint_requested`
is True on every rank at the same step, and each rank saves `rank-R.pt` to
<checkpoint-dir>/<run>/local/step-N, then copies it to .../durable/step-N (the reporter
sends both tiers' checkpoint events). Started with OPSBOARD_RESUME_FROM=<a step-N
directory> (as `opsboard-agent supervise` does on `resume`), it loads its rank's file and
continues from step N + 1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from opsboard_agent.reporter import Reporter

FEATURES = 32
BATCH = 64
PROBE_SEED = 1234


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", help="Opsboard base URL (default: OPSBOARD_SERVER)")
    parser.add_argument("--token-file", help="agent token file (default: OPSBOARD_TOKEN_FILE)")
    parser.add_argument("--run", default="ddp-demo")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--check-every", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--spool-dir", help="per-rank spools go below it")
    parser.add_argument("--straggler-rank", type=int, default=-1)
    parser.add_argument("--straggler-sleep", type=float, default=0.0)
    parser.add_argument("--straggler-repeat", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--perturb-grad-rank", type=int, default=-1)
    parser.add_argument("--flip-param-rank", type=int, default=-1)
    parser.add_argument("--flip-param-step", type=int, default=-1)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument(
        "--checkpoint-dir", default=os.environ.get("OPSBOARD_CHECKPOINT_DIR", "checkpoints")
    )
    return parser.parse_args()


def target(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x.sum(dim=1, keepdim=True))


def all_reduce_gradients(model: nn.Module, world_size: int) -> None:
    """Average the gradients over all ranks, as DDP would, in one flat collective."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def flip_one_bit(model: nn.Module) -> None:
    """Flip the lowest mantissa bit of the first weight: a silent, tiny corruption."""
    with torch.no_grad():
        weight = next(model.parameters())
        bits = weight.view(-1)[:1].view(torch.int32)
        bits ^= 1


def save_checkpoint(
    reporter: Reporter,
    root: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: torch.Generator,
) -> None:
    """Local tier first (fast), then the durable copy; each reported as it happens."""
    rank = dist.get_rank()
    state = {"step": step, "model": model.state_dict(), "data": data.get_state()}
    state["optimizer"] = optimizer.state_dict()
    name = f"step-{step}/rank-{rank}.pt"
    local, durable = root / "local" / name, root / "durable" / name
    with reporter.checkpointing(step, "local", path=str(local.parent)) as info:
        local.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, local)
        info["bytes"] = local.stat().st_size
    with reporter.checkpointing(step, "durable", path=str(durable.parent)) as info:
        durable.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, durable)
        info["bytes"] = durable.stat().st_size


def load_checkpoint(directory: str, rank: int) -> dict:
    path = Path(directory) / f"rank-{rank}.pt"
    return torch.load(path if path.exists() else path.with_name("rank-0.pt"))


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own data shard
    probe_x = torch.randn(BATCH, FEATURES, generator=torch.Generator().manual_seed(PROBE_SEED))
    probe_y = target(probe_x)

    def probe_loss(module: nn.Module) -> torch.Tensor:
        return F.mse_loss(module(probe_x), probe_y)

    if rank == args.perturb_grad_rank:
        for param in model.parameters():
            param.register_hook(lambda grad: grad * (1 + 1e-3))

    spool_dir = f"{args.spool_dir}/rank-{rank}" if args.spool_dir else None
    reporter = Reporter.from_env(
        run=args.run,
        server=args.server,
        token_file=args.token_file,
        check_every=args.check_every,
        spool_dir=spool_dir,
    )
    checkpoints, start = Path(args.checkpoint_dir) / args.run, 0
    if os.environ.get("OPSBOARD_RESUME_FROM"):
        state = load_checkpoint(os.environ["OPSBOARD_RESUME_FROM"], rank)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        data.set_state(state["data"])
        start = state["step"] + 1
    for step in range(start, args.steps):
        with reporter.phase("data"):
            time.sleep(args.step_sleep)
            x = torch.randn(BATCH, FEATURES, generator=data)
            y = target(x)
        with reporter.phase("compute"):
            # A computing straggler does the whole pass again; zeroing the gradients first
            # keeps them (and so every checksum) identical to its peers'.
            repeat = args.straggler_repeat if rank == args.straggler_rank else 1
            for _ in range(max(1, repeat)):
                optimizer.zero_grad(set_to_none=True)
                with ddp.no_sync():
                    loss = F.mse_loss(ddp(x), y)
                    loss.backward()
            if rank == args.straggler_rank:
                time.sleep(args.straggler_sleep)
        with reporter.phase("comm"):
            all_reduce_gradients(model, world_size)
        check = reporter.should_check(step)
        if check:
            reporter.record_grad_checksum(ddp)
        with reporter.phase("compute"):
            optimizer.step()
        if rank == args.flip_param_rank and step == args.flip_param_step:
            flip_one_bit(model)
        if check:
            reporter.record_param_checksum(ddp)
            reporter.record_canary(ddp, probe_loss)
        reporter.step(step, tokens=BATCH, loss=loss.detach())
        if reporter.checkpoint_requested(step):  # an operator asked: every rank saves this step
            save_checkpoint(reporter, checkpoints, step, model, optimizer, data)
    reporter.close(drain_timeout=30)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
