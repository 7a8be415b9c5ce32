"""The FSDP canary on 4 CPU ranks (gloo), every layer sharded over all 4 (no replicas).

    torchrun --standalone --nproc-per-node 4 tests/agent/fsdp_canary.py OUT [--faulty R]
        [--layers N] [--width W] [--fsdp1]

A stack of `--layers` Linear(W, W) layers, each `fully_shard`ed, and the root (`--fsdp1`:
each a FullyShardedDataParallel unit, FULL_SHARD, inside the root's). Each rank trains
one step, then writes OUT/rank<R>.json with:

- `canary`: its canary as the reporter computes it (torchshard.canary_view, one module
  unsharded at a time), and `reference`: the canary of an unsharded copy of the model;
- `whole`: its canary the way it was computed before, every module unsharded at once
  (FSDP2 only: FSDP1's canary was refused);
- `peak`, `peak_whole`: each one's peak extra memory, and what to compare them with:
  `peak_plain`, the peak extra memory of the unsharded copy's canary (its gradients in
  flight, the probe's activations and the projections' fixed ~17 MiB of sampled
  coordinates and weights), `shard_bytes`, `model_bytes` and `layer_bytes`;
- `grads_kept`: whether the training gradients (`.grad`, sharded) are bit for bit as they
  were: the probe's gradients are never reduce-scattered into them.

Rank `--faulty` has a wrong backward (the gradient into every layer's input scaled by
1 + 1e-3), as a GPU computing wrong numbers would.

Peak extra memory is the process's resident high-water mark (VmHWM, reset through
/proc/self/clear_refs just before) above its resident size before the call. glibc's
`mallopt(M_MMAP_THRESHOLD, 64 KiB)` is set first, so every buffer of 64 KiB or more (each
parameter, gradient and all-gather buffer here) is its own mapping, returned to the
system when freed: the resident size then follows what torch holds, and a freed buffer
cannot be reused unseen. It counts what gloo allocates too, and Python's small objects.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import sys
from pathlib import Path
from typing import Any

M_MMAP_THRESHOLD = -3
_LIBC = ctypes.CDLL("libc.so.6")
_LIBC.mallopt(M_MMAP_THRESHOLD, 64 * 1024)  # before torch allocates anything

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import (  # noqa: E402
    FSDPModule,
    FullyShardedDataParallel,
    ShardingStrategy,
    fully_shard,
)
from torch.distributed.fsdp.wrap import ModuleWrapPolicy  # noqa: E402

from opsboard_agent import torchcheck, torchshard  # noqa: E402

BATCH = 8


class ScaleGrad(torch.autograd.Function):
    """Identity forward, backward scaled: a rank whose arithmetic is subtly wrong."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class Layer(nn.Module):
    def __init__(self, width: int, scale: float) -> None:
        super().__init__()
        self.linear, self.scale = nn.Linear(width, width), scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale != 1.0:
            x = ScaleGrad.apply(x, self.scale)
        return torch.tanh(self.linear(x))


def stack(layers: int, width: int, scale: float = 1.0) -> nn.Sequential:
    torch.manual_seed(0)  # every rank starts from the same weights
    return nn.Sequential(*(Layer(width, scale) for _ in range(layers)))


def _resident() -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            found[line[:5]] = int(line.split()[1]) * 1024
    return found["VmRSS"], found["VmHWM"]


def peak_extra(call: Any) -> tuple[Any, int]:
    """`call()`'s result and the resident bytes it added at its peak."""
    gc.collect()
    _LIBC.malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _resident()[0]
    result = call()
    return result, _resident()[1] - before


def canary_whole(model: nn.Module, loss_fn: Any) -> dict:
    """The FSDP2 canary before: every module unsharded at once for the probe."""
    parts = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for part in parts:
        part.unshard()
    try:
        return torchcheck.canary(model, loss_fn)
    finally:
        for part in parts:
            part.reshard()


def _local(tensor: Any) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _full(tensor: Any) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--faulty", type=int, default=-1)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--fsdp1", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    model: nn.Module = stack(args.layers, args.width, 1 + 1e-3 if rank == args.faulty else 1.0)
    if args.fsdp1:
        model = FullyShardedDataParallel(
            model,
            device_mesh=mesh,
            sharding_strategy=ShardingStrategy.FULL_SHARD,
            device_id=torch.device("cpu"),
            auto_wrap_policy=ModuleWrapPolicy({Layer}),
        )
    else:
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(100 + rank)
    x, y = (torch.randn(BATCH, args.width, generator=data) for _ in range(2))
    F.mse_loss(model(x), y).backward()
    optimizer.step()
    probe = torch.Generator().manual_seed(1234)
    probe_x, probe_y = (torch.randn(BATCH, args.width, generator=probe) for _ in range(2))

    def probe_loss(module: nn.Module) -> torch.Tensor:
        return F.mse_loss(module(probe_x), probe_y)

    grads = [_local(p.grad).clone() for p in model.parameters()]

    def canary() -> dict:
        with torchshard.canary_view(model, probe_loss) as (view, loss_fn):
            return torchcheck.canary(view, loss_fn)

    canary()  # warm-up: the first backward allocates its workspaces
    sent, peak = peak_extra(canary)
    whole, peak_whole = (
        (None, None) if args.fsdp1 else peak_extra(lambda: canary_whole(model, probe_loss))
    )
    again, _ = peak_extra(canary)
    kept = all(
        torch.equal(_local(p.grad), g) for p, g in zip(model.parameters(), grads, strict=True)
    )
    plain = stack(args.layers, args.width)
    plain.load_state_dict({name: _full(p) for name, p in model.state_dict().items()})
    torchcheck.canary(plain, probe_loss)  # warm-up, as above
    reference, peak_plain = peak_extra(lambda: torchcheck.canary(plain, probe_loss))
    layer_bytes = sum(p.numel() * p.element_size() for p in plain[0].parameters())
    result = {
        "canary": sent,
        "again": again,
        "whole": whole,
        "reference": reference,
        "peak": peak,
        "peak_whole": peak_whole,
        "peak_plain": peak_plain,
        "grads_kept": kept,
        "shard_bytes": sum(_local(p).numel() * 4 for p in model.parameters()),
        "model_bytes": sum(p.numel() * p.element_size() for p in plain.parameters()),
        "layer_bytes": layer_bytes,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
