"""Sharded layouts on 4 CPU ranks (gloo), each checked through a real Reporter.

    torchrun --standalone --nproc-per-node 4 tests/agent/shard_layouts.py OUT [LAYOUT ...]

Each layout but `ddp` is a 2 x 2 split of the 4 ranks into data-parallel replicas and shards:

- `ddp`: DistributedDataParallel, the unsharded control (four replicas, no shard key);
- `hsdp`: FSDP2 (`fully_shard`) on a 2-D mesh ("replicate", "shard");
- `fsdp1`: FullyShardedDataParallel HYBRID_SHARD on the same mesh, a unit per layer (flat
  parameters);
- `tp`: tensor parallel (`parallelize_module`, column- then row-wise) on ("dp", "tp"),
  gradients averaged over "dp" by hand;
- `pp`: two pipeline stages (`PipelineStage`, GPipe) on ("dp", "pp"), likewise;
- `fsdp_tp`: tensor parallel on "tp" and FSDP2 (`fully_shard`) on "dp" of ("dp", "tp"):
  2-D, every rank a different shard.

Each rank trains two steps and records the three checks with a Reporter whose server does
not answer, reads back from its spool the step report it would have sent, and writes it to
OUT/<layout>-rank<R>.json with what the test compares it to: the canary of an unsharded
copy of the model (FSDP) or the full gradient's norms (TP), and every rank's parameter
checksum after rank 2 flips one bit of its local shard. tests/agent/test_torchshard.py
runs this once and asserts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy, fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel

from opsboard_agent import torchcheck
from opsboard_agent.reporter import Reporter

FEATURES, HIDDEN, OUT, BATCH = 8, 16, 4, 8
CLOSED = "http://127.0.0.1:9"  # discard: nothing answers, the reports stay in the spool


def mlp() -> nn.Sequential:
    torch.manual_seed(0)  # every rank starts from the same weights
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT))


def batch(seed: int, features: int = FEATURES) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, features, generator=data), torch.randn(BATCH, OUT, generator=data)


PROBE_X, PROBE_Y = batch(1234)


def probe_loss(module: nn.Module) -> torch.Tensor:
    return F.mse_loss(module(PROBE_X), PROBE_Y)


def average(model: nn.Module, group: Any) -> None:
    """Data-parallel gradient averaging over `group`, in place on the local shards."""
    for param in model.parameters():
        grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
        dist.all_reduce(grad, group=group)
        grad /= dist.get_world_size(group)


def report(reporter: Reporter, checked: Any, loss_fn: Any, step: Any) -> dict:
    """Two training steps with the checks after the last; the step report as spooled."""
    for number in range(2):
        optimizer = step(number)
        if number == 1:
            reporter.record_grad_checksum(checked)
        optimizer.step()
        if number == 1:
            reporter.record_param_checksum(checked)
            reporter.record_canary(checked, loss_fn)
        reporter.step(number)
    assert reporter.shipper is not None
    reporter.shipper.flush()
    spool = reporter.shipper.spool.directory
    records = [json.loads(path.read_bytes()) for path in sorted(spool.glob("*.batch"))]
    return [s for r in records for s in r.get("steps", []) if s["step"] == 1][0]


def flipped(reporter: Reporter, checked: Any, model: nn.Module) -> str:
    """Rank 2 flips the lowest bit of the first element of its first local shard; every
    rank then digests its parameters again."""
    if dist.get_rank() == 2:
        with torch.no_grad():
            first = next(model.parameters())
            local = first.to_local() if isinstance(first, DTensor) else first
            local.view(-1)[:1].view(torch.int32).bitwise_xor_(1)
    return reporter.record_param_checksum(checked)


def ddp(mesh: DeviceMesh, reporter: Reporter) -> dict:
    model = DistributedDataParallel(mlp())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(number: int) -> torch.optim.Optimizer:
        optimizer.zero_grad()
        x, y = batch(100 * number + dist.get_rank())
        F.mse_loss(model(x), y).backward()
        return optimizer

    return {
        "sent": report(reporter, model, probe_loss, step),
        "flipped": flipped(reporter, model, model.module),
    }


def hsdp(mesh: DeviceMesh, reporter: Reporter) -> dict:
    model = mlp()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(number: int) -> torch.optim.Optimizer:
        optimizer.zero_grad()
        x, y = batch(100 * number + dist.get_rank())  # every rank a data-parallel rank
        F.mse_loss(model(x), y).backward()  # reduce-scatter, then all-reduce over replicas
        return optimizer

    sent = report(reporter, model, probe_loss, step)
    plain = mlp()
    plain.load_state_dict({name: p.full_tensor() for name, p in model.state_dict().items()})
    reference = torchcheck.canary(plain, probe_loss)
    return {"sent": sent, "reference": reference, "flipped": flipped(reporter, model, model)}


def fsdp1(mesh: DeviceMesh, reporter: Reporter) -> dict:
    model = FullyShardedDataParallel(
        mlp(),
        device_mesh=mesh,
        sharding_strategy=ShardingStrategy.HYBRID_SHARD,
        device_id=torch.device("cpu"),
        auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),  # a unit per layer, and the root
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(number: int) -> torch.optim.Optimizer:
        optimizer.zero_grad()
        x, y = batch(100 * number + dist.get_rank())
        F.mse_loss(model(x), y).backward()
        return optimizer

    record, kept = reporter.record_canary, []

    def record_canary(checked: Any, loss_fn: Any) -> dict:
        # The probe's gradients must never reach the training's (sharded) `.grad`.
        grads = [p.grad.clone() for p in model.parameters()]
        value = record(checked, loss_fn)
        pairs = zip(model.parameters(), grads, strict=True)
        kept.append(all(torch.equal(p.grad, g) for p, g in pairs))
        return value

    reporter.record_canary = record_canary  # type: ignore[method-assign]
    sent = report(reporter, model, probe_loss, step)
    # The canary's coordinates are the flat parameters': its norm is the full gradient's.
    plain = mlp()
    plain.load_state_dict(model.state_dict())  # FSDP1's default: the full state dict
    reference = torchcheck.canary(plain, probe_loss)
    return {
        "sent": sent,
        "reference": reference,
        "grads_kept": kept == [True],
        "flipped": flipped(reporter, model, model),
    }


def tp(mesh: DeviceMesh, reporter: Reporter) -> dict:
    model = mlp()
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    replica = mesh["dp"].get_local_rank()

    def step(number: int) -> torch.optim.Optimizer:
        optimizer.zero_grad()
        x, y = batch(100 * number + replica)  # the ranks of one TP group share a batch
        F.mse_loss(model(x), y).backward()
        average(model, mesh["dp"].get_group())
        return optimizer

    sent = report(reporter, model, probe_loss, step)
    # The full probe gradient, and what of it this rank holds (the replicated bias is held
    # by every TP rank): the canary must be the norm of exactly that.
    plain = mlp()
    plain.load_state_dict({name: p.full_tensor() for name, p in model.state_dict().items()})
    grads = torch.autograd.grad(probe_loss(plain), list(plain.parameters()))
    local = [
        distribute_tensor(g, p.device_mesh, p.placements).to_local()
        for g, p in zip(grads, model.parameters(), strict=True)
    ]
    local_norm = float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in local])))
    return {"sent": sent, "local_norm": local_norm, "flipped": flipped(reporter, model, model)}


def fsdp_tp(mesh: DeviceMesh, reporter: Reporter) -> dict:
    model = mlp()
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    replica = mesh["dp"].get_local_rank()

    def step(number: int) -> torch.optim.Optimizer:
        optimizer.zero_grad()
        x, y = batch(100 * number + replica)  # the ranks of one TP group share a batch
        F.mse_loss(model(x), y).backward()  # FSDP reduce-scatters over "dp"
        return optimizer

    sent = report(reporter, model, probe_loss, step)
    # The canary: the probe's full gradient over "dp" (unsharded), this rank's slice of
    # it over "tp", as the tensor-parallel canary is.
    plain = mlp()
    plain.load_state_dict({name: p.full_tensor() for name, p in model.state_dict().items()})
    grads = torch.autograd.grad(probe_loss(plain), list(plain.parameters()))
    tp_mesh = mesh["tp"]
    local = [
        distribute_tensor(g, tp_mesh, (p.placements[-1],)).to_local()
        for g, p in zip(grads, model.parameters(), strict=True)
    ]
    local_norm = float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in local])))
    return {"sent": sent, "local_norm": local_norm, "flipped": flipped(reporter, model, model)}


def pp(mesh: DeviceMesh, reporter: Reporter) -> dict:
    index = mesh["pp"].get_local_rank()
    layers = list(mlp())
    module = nn.Sequential(*(layers[:2] if index == 0 else layers[2:]))
    stage = PipelineStage(module, index, 2, torch.device("cpu"), group=mesh["pp"].get_group())
    schedule = ScheduleGPipe(stage, 2, loss_fn=F.mse_loss)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    replica = mesh["dp"].get_local_rank()
    # The canary of a stage probes the stage alone: a fixed input of its own width.
    stage_probe = batch(4321, FEATURES if index == 0 else HIDDEN)[0]

    def stage_loss(part: nn.Module) -> torch.Tensor:
        return part(stage_probe).pow(2).mean()

    def step(number: int) -> torch.optim.Optimizer:
        optimizer.zero_grad()
        x, y = batch(100 * number + replica)
        if index == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        average(module, mesh["dp"].get_group())
        return optimizer

    sent = report(reporter, stage, stage_loss, step)
    return {"sent": sent, "flipped": flipped(reporter, stage, module)}


LAYOUTS = {
    "ddp": (ddp, ("replicate", "shard")),  # the mesh is not used
    "hsdp": (hsdp, ("replicate", "shard")),
    "fsdp1": (fsdp1, ("replicate", "shard")),
    "tp": (tp, ("dp", "tp")),
    "pp": (pp, ("dp", "pp")),
    "fsdp_tp": (fsdp_tp, ("dp", "tp")),
}


def main() -> None:
    out, names = Path(sys.argv[1]), sys.argv[2:] or list(LAYOUTS)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for name in names:
        build, dims = LAYOUTS[name]
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=dims)
        reporter = Reporter(
            run=f"layout-{name}",
            server=CLOSED,
            token="t",
            node="node-01",
            rank=rank,
            world_size=4,
            check_every=1,
            spool_dir=out / f"spool-{name}-{rank}",
            flush_interval=3600,
            commands=False,
        )
        result = build(mesh, reporter)
        reporter.close(drain_timeout=0, state=None)
        (out / f"{name}-rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
