"""Sharded models for the corruption checks: which ranks must agree, and what each one holds.

"Every replica holds the same bytes" is true of a data-parallel (DDP) job as a whole; in a
sharded job it holds only between the ranks that hold the same shard. Three things follow:

- `shard_key(model)`: a string equal on ranks that hold the same bytes and different
  otherwise, sent as the step report's `shard` (the server compares only ranks with the
  same one). None for an unsharded model: every rank is a replica, as with DDP.
- `local_view(model)`: what the checksums digest, the rank's own shard of each parameter
  and of its gradient (a DTensor's local tensor, no copy).
- `canary_view(model, loss_fn)`: what the canary probes. Under FSDP the model is probed
  unsharded, one module at a time (opsboard_agent.torchprobe): each rank then computes
  the full local gradient, the same on every healthy rank, whatever shard it holds; a
  tensor-parallel model is probed through its local shards.

Layouts understood: FSDP2 and HSDP (`fully_shard`), tensor parallel (`parallelize_module`)
and any other DTensor parameters, FSDP1 (`FullyShardedDataParallel`, flat parameters),
pipeline stages (`torch.distributed.pipelining.PipelineStage`: pass the stage, whose
`submod` is the module), and combinations of these (FSDP2 with tensor parallelism: 2-D).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
from torch.distributed.tensor import DTensor, Replicate
from torch.func import functional_call

from opsboard_agent.torchcheck import unwrap
from opsboard_agent.torchprobe import fsdp1_probe, fsdp2_probe

KEY_MAX = 128  # the contract's bound on `shard` (apps/core/bounds.py SHARD_MAX_LENGTH)
HASH_HEX = 12  # 48 bits of BLAKE2b: layouts of one job never collide in practice
# A key names the canary's group after this (detectors.sdc.CANARY_MARK; the agent imports
# nothing of the server's), in at most CANARY_MAX characters.
CANARY_MARK = ";canary="
CANARY_MAX = 40


def shard_key(model: Any) -> str | None:
    """`<where>-<hash>` for a sharded model (FSDP2: `<where>-<hash>;canary=<group>`), None
    for an unsharded one.

    `<where>` is for people: this rank's coordinate on each sharded dimension, e.g.
    `fsdp2-shard=1of2`, `tp=0of2`, `pp=1of4-tp=0of8`. The hash (12 hex of BLAKE2b) is of
    the full description: every parameter's name, dtype and global shape; for a DTensor
    its placements, its mesh's dimension names and sizes, and this rank's coordinate on the
    dimensions where it is not replicated; for FSDP1 the rank within the sharding group;
    for a pipeline stage its index. Replicated dimensions are left out, so the
    data-parallel replicas of one shard (HSDP's replicas, tensor parallel's data-parallel
    peers) share a key. Nothing in it depends on a global rank.

    Under FSDP2 the canary probes the model unsharded (`canary_view`): every rank's canary
    is then the whole model's gradient, or its tensor-parallel / pipeline slice, comparable
    across FSDP's shards. `<group>` is the same description without FSDP2's dimensions,
    `<where>-<hash>` again (`all-<hash>` when nothing else is sharded), and the server
    compares canaries within it, checksums within the whole key."""
    stage = _stage(model)
    module = _module(model)
    fsdp_dims = _fsdp2_dims(module)
    key, canary = _Description(), _Description()
    for description in (key, canary):
        description.lines.append(f"stage:{stage}")
        if stage is not None:
            description.where[f"pp={stage[0]}of{stage[1]}"] = None
    if fsdp_dims is not None:
        key.where["fsdp2"] = None
    for name, param in module.named_parameters():
        _describe(name, param, key, canary, fsdp_dims or set())
    fsdp1 = _describe_fsdp1(model, key, canary)
    if not key.where or list(key.where) == ["fsdp2"]:  # fsdp2 alone: every one replicated
        return None
    if fsdp_dims is None and not fsdp1:
        return key.render(KEY_MAX)
    group = canary.render(CANARY_MAX)
    return key.render(KEY_MAX - len(CANARY_MARK) - len(group)) + CANARY_MARK + group


class _Description:
    """What a key says: the coordinates for people (an ordered set) and the hashed lines."""

    def __init__(self) -> None:
        self.where: dict[str, None] = {}
        self.lines: list[str] = []

    def render(self, limit: int) -> str:
        digest = hashlib.blake2b("\n".join(self.lines).encode(), digest_size=HASH_HEX // 2)
        where = "-".join(self.where) or "all"
        return f"{where[: limit - HASH_HEX - 1]}-{digest.hexdigest()}"


def _describe(
    name: str, param: torch.Tensor, key: _Description, canary: _Description, fsdp: set[str]
) -> None:
    """One parameter's line of the key's description and of its canary group's (which
    leaves out the mesh dimensions named in `fsdp`), their sharded coordinates added."""
    line = f"{name}:{param.dtype}:{tuple(param.shape)}"
    if not isinstance(param, DTensor):
        key.lines.append(line)
        canary.lines.append(line)
        return
    mesh = param.device_mesh
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
    coordinate = mesh.get_coordinate() or ()
    sharded, kept = [], []
    for dim, placement in enumerate(param.placements):
        if names[dim] not in fsdp:
            kept.append(f"{names[dim]}:{mesh.size(dim)}:{placement}")
        if isinstance(placement, Replicate) or mesh.size(dim) == 1:
            continue  # the replicas along this dimension hold the same bytes
        at = f"{names[dim]}={coordinate[dim]}of{mesh.size(dim)}"
        key.where[at] = None
        sharded.append(at)
        if names[dim] not in fsdp:
            canary.where[at] = None
    key.lines.append(f"{line}:{param.placements}:{names}:{tuple(mesh.shape)}:{sharded}")
    canary.lines.append(f"{line}:{kept}:{[at for at in sharded if at in canary.where]}")


def _fsdp2_dims(module: nn.Module) -> set[str] | None:
    """The names of the mesh dimensions FSDP2 shards or replicates `module`'s parameters
    over (HSDP's two, or the data-parallel one beside tensor parallelism); None without
    FSDP2. An unnamed mesh's dimensions are `dim0`, ... as in `_describe`."""
    parts = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not parts:
        return None
    dims: set[str] = set()
    for part in parts:
        for group in part._get_fsdp_state()._fsdp_param_groups:
            mesh = group.mesh_info.mesh
            dims.update(mesh.mesh_dim_names or (f"dim{i}" for i in range(mesh.ndim)))
    return dims


def _describe_fsdp1(model: Any, key: _Description, canary: _Description) -> bool:
    """FSDP1's part of the description: each wrapper's rank within its sharding group (its
    flat parameters' local shapes are often equal across ranks); for the canary's group,
    which probes the unsharded flat parameters, their sizes instead. Whether any wrapper
    shards."""
    sharded = False
    for fsdp in _fsdp1_modules(model):
        rank, size = fsdp.rank, fsdp.world_size
        if size > 1 and fsdp.sharding_strategy.name != "NO_SHARD":
            sharded = True
            key.where[f"fsdp1={rank}of{size}"] = None
            key.lines.append(f"fsdp1:{fsdp.sharding_strategy}:{rank}/{size}")
        handle = fsdp._handle
        if handle is not None:
            unsharded = tuple(handle.flat_param._unpadded_unsharded_size)
            canary.lines.append(f"fsdp1:{fsdp.sharding_strategy}:{size}:{unsharded}")
    return sharded


def local_view(model: Any) -> Any:
    """What the checksums digest: `model` itself (or a pipeline stage's module) when no
    parameter is a DTensor, else a `LocalShards` view of its local shards."""
    module = _module(model)
    if not _has_dtensors(module):
        return model if _stage(model) is None else module
    return LocalShards(module)


class LocalShards(nn.Module):
    """A module's parameters as this rank's local shards, each carrying the local shard of
    its gradient: the same storage (no copy), under the same names, in the same order.

    Only `named_parameters` (and so `parameters`) are meaningful: it is a view for digests,
    not a module to run."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self._shards: list[tuple[str, nn.Parameter]] = []
        for name, param in module.named_parameters():
            shard = nn.Parameter(_local(param.detach()), requires_grad=param.requires_grad)
            if param.grad is not None:
                shard.grad = _local(param.grad)
            self._shards.append((name, shard))

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        for name, shard in self._shards:
            yield (f"{prefix}.{name}" if prefix else name), shard


@contextlib.contextmanager
def canary_view(
    model: Any, loss_fn: Callable[[Any], torch.Tensor]
) -> Iterator[tuple[Any, Callable[[Any], torch.Tensor]]]:
    """`(model, loss_fn)` for `torchcheck.canary`, so that its gradients are this rank's
    own local gradients of the probe, never reduced across data-parallel ranks.

    - Unsharded (DDP, a pipeline stage of plain tensors): as given (a stage's module).
    - FSDP2, and FSDP2 with tensor parallelism: a view whose parameters are the unsharded
      ones, called through the FSDP2 root, whose hooks unshard one module at a time
      (`torchprobe.fsdp2_probe`): the full local gradient (its TP slice under 2-D), at the
      memory of about two modules unsharded.
    - FSDP1: a view whose parameters are the flat parameters, called through the root
      wrapper (which must be what is passed), a unit at a time (`torchprobe.fsdp1_probe`).
    - Other DTensor parameters (tensor parallel): a view whose parameters are the local
      shards as leaf tensors; calling it runs the module with DTensors built on them
      (`torch.func.functional_call`), so the probe's gradients land on the local shards.
      `loss_fn` must call the module it is given (not reach into its submodules).

    Every rank must call it at the same step: unsharding is a collective."""
    fsdp1 = _fsdp1_modules(model)
    if fsdp1:
        root = model.submod if _stage(model) is not None else model
        if root is not fsdp1[0]:
            # a caller's mistake, not a layout left out: FSDP1's probe runs through its root
            raise ValueError("the canary of FSDP1 needs the root wrapper passed")
        with fsdp1_probe(root, fsdp1) as flat:
            yield flat, loss_fn
        return
    module = _module(model)
    fsdp = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not fsdp:
        if _has_dtensors(module):
            yield _ShardLeaves(module), loss_fn
        else:
            yield (model if _stage(model) is None else module), loss_fn
        return
    with fsdp2_probe(module, fsdp) as view:
        yield view, loss_fn


class _ShardLeaves(nn.Module):
    """The canary's view of a module with DTensor parameters (see `canary_view`)."""

    _target: nn.Module

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        # Not a submodule: the view's parameters are the leaves alone.
        object.__setattr__(self, "_target", module)
        self.training = module.training
        self._leaves: list[tuple[str, nn.Parameter, Any]] = [
            (
                name,
                nn.Parameter(_local(param.detach()), requires_grad=param.requires_grad),
                param,
            )
            for name, param in module.named_parameters()
        ]

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        for name, leaf, _ in self._leaves:
            yield (f"{prefix}.{name}" if prefix else name), leaf

    def train(self, mode: bool = True) -> _ShardLeaves:
        self._target.train(mode)
        self.training = mode
        return self

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        params = {
            name: _rebuild(leaf, like) if isinstance(like, DTensor) else leaf
            for name, leaf, like in self._leaves
        }
        return functional_call(self._target, params, args, kwargs)


def _rebuild(leaf: torch.Tensor, like: Any) -> Any:
    """A DTensor laid out as `like` whose local tensor is `leaf` (differentiable)."""
    return DTensor.from_local(
        leaf,
        like.device_mesh,
        like.placements,
        run_check=False,
        shape=like.shape,
        stride=like.stride(),
    )


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _has_dtensors(module: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in module.parameters())


def _stage(model: Any) -> tuple[int, int] | None:
    """(stage index, number of stages) of a pipeline stage (duck-typed on
    `torch.distributed.pipelining`'s stages: `submod`, `stage_index`, `num_stages`)."""
    if isinstance(getattr(model, "submod", None), nn.Module) and hasattr(model, "stage_index"):
        return int(model.stage_index), int(model.num_stages)
    return None


def _module(model: Any) -> nn.Module:
    """The module whose parameters the rank holds: a stage's, or inside a DDP wrapper."""
    return unwrap(model.submod if _stage(model) is not None else model)


def _fsdp1_modules(model: Any) -> list[Any]:
    """The FSDP1 wrappers in `model` (the root included, which `unwrap` removes)."""
    root = model.submod if _stage(model) is not None else model
    if not isinstance(root, nn.Module):
        return []
    return [m for m in root.modules() if isinstance(m, FullyShardedDataParallel)]
