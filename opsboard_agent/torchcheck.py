"""PyTorch helpers for the three silent-data-corruption checks of the contract.

Imported lazily by the reporter (this module imports torch; the rest of the package does
not). All three are meant to run every N steps, not every step.

- `grad_checksum`: a digest of the gradients after all-reduce. Every data-parallel replica
  of a healthy run holds the very same bytes, so replicas are compared bit for bit.
- `param_checksum`: the same for the parameters after the optimizer step.
- `canary`: the L2 norm and a few fixed random projections of the *local* gradient of one
  fixed probe batch, computed with the current weights and without any all-reduce (on the
  unwrapped module). A GPU that computes wrong gradients shows up here and only here:
  all-reduce would spread its error to every replica.

The checksums are computed on the tensors' device (`opsboard_agent.torchdigest`); the
canary gathers its sampled coordinates tensor by tensor, so neither makes a copy of the
model: their extra memory is the canary's own gradients plus a few MiB.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from opsboard_agent import torchdigest

PROJECTION_COORDS = 65536  # coordinates sampled per projection: bounded cost on big models
NORM_PIECE = 1 << 20  # elements a float64 norm reads at once: 8 MiB, not a gradient's copy


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DistributedDataParallel (or similar `.module`) wrapper."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


def tensors_digest(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """Hex digest (32 chars) of names, dtypes, shapes and raw bits, in the given order.

    Raw bits, not values: -0.0 vs 0.0 or two NaN payloads differ, as bit-exact agreement
    requires. Computed where the tensors live, one host copy of a few bytes per 16 MiB."""
    return torchdigest.digest(tensors)


def grad_checksum(model: torch.nn.Module) -> str:
    """Digest of every parameter's `.grad` (parameters without one are skipped)."""
    return tensors_digest(
        (name, p.grad) for name, p in unwrap(model).named_parameters() if p.grad is not None
    )


def param_checksum(model: torch.nn.Module) -> str:
    return tensors_digest(unwrap(model).named_parameters())


def canary(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.nn.Module], torch.Tensor],
    *,
    projections: int = 4,
    seed: int = 0,
) -> dict[str, Any]:
    """`{"norm": float, "proj": [float, ...]}` of the local gradient of `loss_fn(module)`.

    `loss_fn` computes the loss of the fixed probe batch with the module it is given (the
    unwrapped one, so no DDP hook or all-reduce runs). Gradients come from
    `torch.autograd.grad`, which returns them without touching any `.grad`, so training is
    unaffected. The module runs in eval mode for the probe: dropout would draw from the
    training RNG (changing training) and make the probe differ between ranks.

    The projections sample coordinates of the gradients laid end to end (`PROJECTION_COORDS`
    per projection, drawn from `seed`), but the gradients are never concatenated, nor even
    kept: a hook on each parameter reads its gradient as backward produces it (the sampled
    coordinates, the sum of squares) and hands autograd an expanded zero in its place, so
    the probe's extra memory is the gradients in flight, not all of them at once.

    A DTensor parameter's gradient is read as its local shard (tensor parallel: this
    rank's slice of the probe's gradient). `module` may be a view (opsboard_agent.
    torchshard.canary_view) whose `gradient_sizes()` says how many elements each
    parameter's gradient will have when that differs from the parameter's own (FSDP1's
    flat parameters, sharded until the probe unshards them)."""
    module = unwrap(model)
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        return {"norm": 0.0, "proj": [0.0] * projections}
    sizes = getattr(module, "gradient_sizes", None)  # a view whose gradients differ in size
    numels = sizes() if callable(sizes) else [_local_of(p, p).numel() for p in params]
    projector = _Projector(numels, projections, seed, params[0].device)
    handles = [p.register_hook(projector.hook(number, p)) for number, p in enumerate(params)]
    try:
        grads = _probe_gradients(module, params, loss_fn)
    finally:
        for handle in handles:
            handle.remove()
    for number, gradient in enumerate(grads):
        if gradient is not None and number not in projector.seen:
            # a gradient no hook saw (none, as torch stands)
            projector.add(number, _local_of(gradient, params[number]))
    del grads
    return projector.result()


def _probe_gradients(
    module: torch.nn.Module,
    params: Sequence[torch.Tensor],
    loss_fn: Callable[[torch.nn.Module], torch.Tensor],
) -> list[torch.Tensor | None]:
    was_training = module.training
    module.eval()
    try:
        with torch.enable_grad():
            loss = loss_fn(module)
            return list(torch.autograd.grad(loss, params, allow_unused=True))
    finally:
        module.train(was_training)


class _Projector:
    """The norm and projections, gradient by gradient, in any order: each gradient's
    sampled products land in their own slots and are summed at the end as one vector per
    projection, the same products in the same order as a concatenation would give."""

    def __init__(self, sizes: Sequence[int], projections: int, seed: int, device) -> None:
        self.count = min(sum(sizes), PROJECTION_COORDS)
        index, weights = _draws(sum(sizes), self.count, projections, seed)
        self.picks = _Picks(index.reshape(-1), sizes, device)
        self.weights = weights.reshape(-1).to(device)
        self.products = torch.zeros_like(self.weights)  # unused parameters: zero
        self.squares = torch.zeros((), dtype=torch.float64, device=device)
        self.seen: set[int] = set()

    def hook(self, number: int, param: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        def read(gradient: torch.Tensor) -> torch.Tensor:
            self.add(number, _local_of(gradient, param))
            # Same shape, no memory: autograd.grad returns this instead of the gradient.
            return _zero_like(gradient)

        return read

    def add(self, number: int, gradient: torch.Tensor) -> None:
        self.seen.add(number)
        device = self.products.device
        positions, local = self.picks.of(number)
        picked = torch.take(gradient, local.to(gradient.device)).to(device, torch.float64)
        self.products[positions] = picked * self.weights[positions]
        self.squares += _squared_norm(gradient).to(device)

    def result(self) -> dict[str, Any]:
        sums = [part.sum() for part in self.products.view(-1, self.count)]
        # The one host sync of the canary: the norm and every projection in one copy.
        norm, *values = torch.stack([self.squares.sqrt(), *sums]).cpu().tolist()
        return {"norm": norm, "proj": [value / math.sqrt(self.count) for value in values]}


def _draws(total: int, count: int, projections: int, seed: int):
    """`(projections, count)` coordinates and float64 weights, drawn in the same order as
    ever (coordinates, then weights, projection by projection): the same on every rank
    and every check, and the same values the concatenating implementation drew."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    index, weights = [], []
    for _ in range(projections):
        index.append(torch.randint(total, (count,), generator=generator))
        weights.append(torch.randn(count, generator=generator, dtype=torch.float64))
    return torch.stack(index), torch.stack(weights)


class _Picks:
    """The sampled flat coordinates bucketed by the tensor they fall in, sorted once on the
    host and moved to the device once, so each gradient's share is a slice there."""

    def __init__(self, flat: torch.Tensor, sizes: Sequence[int], device: torch.device):
        ends = torch.tensor(sizes, dtype=torch.int64).cumsum(0)
        owner = torch.searchsorted(ends, flat, right=True)
        order = torch.argsort(owner, stable=True)
        local = flat - (ends - torch.tensor(sizes, dtype=torch.int64))[owner]
        bounds = torch.bincount(owner, minlength=len(sizes)).cumsum(0).tolist()
        self._bounds = [0, *bounds]
        self._positions = order.to(device)
        self._local = local[order].to(device)

    def of(self, number: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions among all samples, coordinates within tensor `number`)."""
        start, end = self._bounds[number], self._bounds[number + 1]
        return self._positions[start:end], self._local[start:end]


def _local_of(tensor: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A tensor as this rank holds it: itself, or a DTensor's local shard laid out as its
    parameter (a gradient may come `Partial`; redistributing it to the parameter's
    placements is the tensor-parallel reduction a backward completes anyway)."""
    if not hasattr(tensor, "to_local"):
        return tensor
    placements = param.placements  # type: ignore[attr-defined]
    if tuple(tensor.placements) != tuple(placements):  # type: ignore[attr-defined]
        tensor = tensor.redistribute(param.device_mesh, placements)  # type: ignore[attr-defined]
    return tensor.to_local()


def _zero_like(gradient: torch.Tensor) -> torch.Tensor:
    """An expanded zero of `gradient`'s shape and kind (a DTensor's over its mesh)."""
    if not hasattr(gradient, "to_local"):
        return torch.zeros((), dtype=gradient.dtype, device=gradient.device).expand_as(gradient)
    local = gradient.to_local()
    return type(gradient).from_local(  # type: ignore[attr-defined]
        _zero_like(local),
        gradient.device_mesh,  # type: ignore[attr-defined]
        gradient.placements,  # type: ignore[attr-defined]
        run_check=False,
        shape=gradient.shape,
        stride=gradient.stride(),
    )


def _squared_norm(gradient: torch.Tensor) -> torch.Tensor:
    """Sum of squares in float64, a piece at a time: `vector_norm(g, dtype=float64)` on the
    whole gradient would first make a float64 copy of it."""
    total = torch.zeros((), dtype=torch.float64, device=gradient.device)
    for piece in torchdigest.logical_pieces(gradient, NORM_PIECE):
        total += torch.linalg.vector_norm(piece, dtype=torch.float64).square()
    return total
