"""A small FSDP2 training job, sharded and replicated (HSDP), reporting through opsboard_agent.

    torchrun --standalone --nproc-per-node 6 examples/fsdp_train.py \
        --server http://127.0.0.1:8000 --token-file token --run demo --replicas 3 --steps 200

Runs on CPUs (gloo). `fully_shard` on a 2-D mesh ("replicate", "shard"): the ranks form
`--replicas` replicas, each sharding every layer over world / replicas ranks; gradients are
reduce-scattered within a replica, then all-reduced across replicas. So the ranks holding
the same shard (one per replica) hold the same bytes, and the others do not: the reporter
derives each rank's shard key from the model (opsboard_agent.torchshard) and sends it with
its step reports, and the server compares each shard's replicas with each other. Telling
a corrupt replica from a healthy one needs a majority: three replicas or more. The canary
probes the whole model (unsharded, module by module), so it is compared across every rank:
`--replicas 1` (every rank its own shard) still names a rank whose backward is wrong.

Fault hooks, for tests of the server's detectors:
  --flip-param-rank R --flip-param-step K  rank R flips the lowest bit of one weight of its
                                           shard at step K (its param checksum disagrees
                                           with its shard's replicas from then on; its
                                           replica's peers all-gather that weight, but it
                                           moves their canaries far less than the tolerance)
  --flip-param-bit B                       flip bit B instead (23: the lowest exponent bit,
                                           the weight doubled or halved: a large corruption
                                           that moves the canary of every rank of R's
                                           replica, which all-gathers it)
  --perturb-grad-rank R                    rank R's backward is wrong: the gradient into its
                                           hidden layer is scaled by 1+1e-3 (its canary
                                           disagrees; the reductions spread the rest)
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from opsboard_agent.reporter import Reporter

FEATURES, HIDDEN, BATCH = 32, 64, 64
PROBE_SEED = 1234


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", help="Opsboard base URL (default: OPSBOARD_SERVER)")
    parser.add_argument("--token-file", help="agent token file (default: OPSBOARD_TOKEN_FILE)")
    parser.add_argument("--run", default="fsdp-demo")
    parser.add_argument("--replicas", type=int, default=2, help="must divide the world size")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--check-every", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--spool-dir", help="per-rank spools go below it")
    parser.add_argument("--perturb-grad-rank", type=int, default=-1)
    parser.add_argument("--flip-param-rank", type=int, default=-1)
    parser.add_argument("--flip-param-step", type=int, default=-1)
    parser.add_argument("--flip-param-bit", type=int, default=0, choices=range(31))
    return parser.parse_args()


class ScaleGrad(torch.autograd.Function):
    """Identity forward, backward scaled: a rank whose arithmetic is subtly wrong."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class Net(nn.Module):
    def __init__(self, grad_scale: float = 1.0) -> None:
        super().__init__()
        self.hidden, self.out = nn.Linear(FEATURES, HIDDEN), nn.Linear(HIDDEN, 1)
        # Not a parameter or submodule: the faulty rank's model has the same parameters
        # (names and shapes) as its replicas', so its shard key is theirs.
        self.grad_scale = grad_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.hidden(x))
        if self.grad_scale != 1.0:
            h = ScaleGrad.apply(h, self.grad_scale)
        return self.out(h)


def target(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x.sum(dim=1, keepdim=True))


def flip_one_bit(model: Net, bit: int = 0) -> None:
    """Flip one bit (by default the lowest mantissa bit) of the first element of this
    rank's shard of the first weight: a silent corruption of bytes only this rank holds."""
    with torch.no_grad():
        weight = model.hidden.weight
        local = weight.to_local() if isinstance(weight, DTensor) else weight
        local.view(-1)[:1].view(torch.int32).bitwise_xor_(1 << bit)


def build(args: argparse.Namespace, rank: int, world_size: int) -> Net:
    mesh = init_device_mesh(
        "cpu", (args.replicas, world_size // args.replicas), mesh_dim_names=("replicate", "shard")
    )
    torch.manual_seed(0)  # every rank starts from the same weights
    model = Net(grad_scale=1 + 1e-3 if rank == args.perturb_grad_rank else 1.0)
    fully_shard(model.hidden, mesh=mesh)
    fully_shard(model.out, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = build(args, rank, world_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    probe_x = torch.randn(BATCH, FEATURES, generator=torch.Generator().manual_seed(PROBE_SEED))
    probe_y = target(probe_x)

    def probe_loss(module: nn.Module) -> torch.Tensor:
        return F.mse_loss(module(probe_x), probe_y)

    reporter = Reporter.from_env(
        run=args.run,
        server=args.server,
        token_file=args.token_file,
        check_every=args.check_every,
        spool_dir=f"{args.spool_dir}/rank-{rank}" if args.spool_dir else None,
    )
    for step in range(args.steps):
        with reporter.phase("data"):
            x = torch.randn(BATCH, FEATURES, generator=data)
            y = target(x)
        with reporter.phase("compute"):
            optimizer.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(x), y)
            loss.backward()  # FSDP's reduce-scatter and all-reduce run inside backward
        check = reporter.should_check(step)
        if check:  # every rank checks at the same steps: the canary unshards (a collective)
            reporter.record_grad_checksum(model)
        with reporter.phase("compute"):
            optimizer.step()
        if rank == args.flip_param_rank and step == args.flip_param_step:
            flip_one_bit(model, args.flip_param_bit)
        if check:
            reporter.record_param_checksum(model)
            reporter.record_canary(model, probe_loss)
        reporter.step(step, tokens=BATCH, loss=loss.detach())
    reporter.close(drain_timeout=30)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
