"""PyTorch helpers for the three silent-data-corruption checks of the contract.

Imported lazily by the reporter (this module imports torch; the rest of the package does
not). All three are meant to run every N steps, not every step.

- `grad_checksum`: a hash of the gradients after all-reduce. Every data-parallel replica of
  a healthy run holds the very same bytes, so replicas are compared bit for bit.
- `param_checksum`: the same for the parameters after the optimizer step.
- `canary`: the L2 norm and a few fixed random projections of the *local* gradient of one
  fixed probe batch, computed with the current weights and without any all-reduce (on the
  unwrapped module). A GPU that computes wrong gradients shows up here and only here:
  all-reduce would spread its error to every replica.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

PROJECTION_COORDS = 65536  # coordinates sampled per projection: bounded cost on big models


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DistributedDataParallel (or similar `.module`) wrapper."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


def tensors_digest(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """Hex digest (32 chars) of names, dtypes, shapes and raw bytes, in the given order.

    Raw bytes, not values: -0.0 vs 0.0 or two NaN payloads differ, as bit-exact agreement
    requires."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in tensors:
        data = tensor.detach()
        if data.device.type != "cpu":
            data = data.cpu()
        data = data.contiguous()
        digest.update(f"{name}:{data.dtype}:{tuple(data.shape)};".encode())
        if data.numel():
            digest.update(ctypes.string_at(data.data_ptr(), data.numel() * data.element_size()))
    return digest.hexdigest()


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
    training RNG (changing training) and make the probe differ between ranks."""
    module = unwrap(model)
    params = [p for p in module.parameters() if p.requires_grad]
    was_training = module.training
    module.eval()
    try:
        with torch.enable_grad():
            loss = loss_fn(module)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
    finally:
        module.train(was_training)
    flat = torch.cat(
        [
            (g if g is not None else torch.zeros_like(p)).reshape(-1).to(torch.float64)
            for g, p in zip(grads, params, strict=True)
        ]
    )
    del grads
    result: dict[str, Any] = {"norm": float(torch.linalg.vector_norm(flat)), "proj": []}
    generator = torch.Generator(device="cpu").manual_seed(seed)
    count = min(flat.numel(), PROJECTION_COORDS)
    for _ in range(projections):
        # Fixed (seeded) coordinates and weights: the same on every rank and every check.
        index = torch.randint(flat.numel(), (count,), generator=generator)
        weights = torch.randn(count, generator=generator, dtype=torch.float64)
        value = float((flat[index.to(flat.device)] * weights.to(flat.device)).sum())
        result["proj"].append(value / math.sqrt(count))
    return result
