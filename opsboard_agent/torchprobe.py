"""The canary's probe of an FSDP model, one module's parameters unsharded at a time.

FSDP1 is at `fsdp1_probe`, below; this first part is FSDP2's.

`torchshard.canary_view` hands `torchcheck.canary` a view of the model whose parameters
are FSDP2's *unsharded* parameters and whose call runs the model through its FSDP2 root.
FSDP2's own hooks then do what they do in training, module by module: a module's
pre-forward all-gathers its parameters, its post-forward frees them, its pre-backward
all-gathers them again and its post-backward frees them; the canary's per-parameter hooks
read each unsharded gradient as backward produces it and hand autograd an expanded zero.
So at any moment the probe holds about one or two modules' unsharded parameters and
gradients (the one computing, the one prefetched), never the whole model's.

Why the gradients stay this rank's own: the canary takes them with `torch.autograd.grad`,
which never writes `.grad`; FSDP2 reduce-scatters only what it finds in the unsharded
parameters' `.grad`, and for the probe every parameter group is also set not to reduce
(`reduce_grads = False`, as `set_requires_gradient_sync(False)` does). Only the
parameters are all-gathered, so a rank whose backward is wrong computes a wrong canary
alone. Every parameter group is set to free its unsharded parameters after forward and
after backward for the probe (the root's `reshard_after_forward` is False by default),
and each group's settings are put back after it.

This reads FSDP2's parameter groups (`_get_fsdp_state()._fsdp_param_groups`, each
`FSDPParam`'s `_unsharded_param`): private, as of torch 2.13, checked by the tests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

# What a parameter group's probe settings are, saved and put back.
_SETTINGS = ("reduce_grads", "all_reduce_grads", "reshard_after_backward", "post_forward_mesh_info")


@contextlib.contextmanager
def fsdp2_probe(module: nn.Module, parts: Sequence[FSDPModule]) -> Iterator[UnshardedView]:
    """`module` (holding the `fully_shard` modules `parts`) set for the probe, as a view
    whose parameters are the unsharded ones; every rank must enter it at the same step."""
    groups = [group for part in parts for group in part._get_fsdp_state()._fsdp_param_groups]
    saved = [{name: getattr(group, name) for name in _SETTINGS} for group in groups]
    states = [part._get_fsdp_state() for part in parts]
    auto = [state._auto_reshard_after_forward for state in states]
    try:
        for part in parts:
            part.set_reshard_after_forward(True, recurse=False)
            part.set_reshard_after_backward(True, recurse=False)
            part.set_requires_gradient_sync(False, recurse=False)
        _materialise(parts)
        yield UnshardedView(module, groups)
    finally:
        for group, settings in zip(groups, saved, strict=True):
            group.reshard()  # a probe that failed half way may have left one unsharded
            for name, value in settings.items():
                setattr(group, name, value)
        for state, value in zip(states, auto, strict=True):
            state._auto_reshard_after_forward = value


def _materialise(parts: Sequence[FSDPModule]) -> None:
    """Make every group's unsharded parameter objects exist (FSDP2 creates them at a
    group's first all-gather and reuses them after, freeing only their storage), one
    module at a time: the canary registers its hooks on them before the forward."""
    for part in parts:
        groups = part._get_fsdp_state()._fsdp_param_groups
        if all(hasattr(p, "_unsharded_param") for g in groups for p in g.fsdp_params):
            continue
        part.unshard()
        part.reshard()


class UnshardedView(nn.Module):
    """The canary's view of an FSDP2 model: its parameters, by the model's names, are the
    unsharded ones (a parameter no `fully_shard` manages is itself); calling it calls the
    model. Only for `torchcheck.canary`."""

    _target: nn.Module

    def __init__(self, module: nn.Module, groups: list[Any]) -> None:
        super().__init__()
        object.__setattr__(self, "_target", module)  # not a submodule: its own parameters
        self.training = module.training
        unsharded: dict[int, torch.Tensor] = {}
        for group in groups:
            for fsdp_param in group.fsdp_params:
                full = fsdp_param._unsharded_param
                # Registered is the sharded one, or the unsharded one mid-step.
                unsharded[id(fsdp_param.sharded_param)] = unsharded[id(full)] = full
        self._params: list[tuple[str, torch.Tensor]] = [
            (name, unsharded.get(id(param), param)) for name, param in module.named_parameters()
        ]

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        for name, param in self._params:
            yield (f"{prefix}.{name}" if prefix else name), param  # type: ignore[misc]

    def train(self, mode: bool = True) -> UnshardedView:
        self._target.train(mode)
        self.training = mode
        return self

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._target(*args, **kwargs)


@contextlib.contextmanager
def fsdp1_probe(root: nn.Module, units: list[Any]) -> Iterator[FlatView]:
    """The probe of an FSDP1 model through its root wrapper `root` (`units`: every
    `FullyShardedDataParallel` in it), as a view whose parameters are the wrappers'
    `FlatParameter`s; every rank must enter it at the same step.

    FSDP1's own hooks all-gather each unit's flat parameter in its pre-forward and
    pre-backward (and free it after forward, but for the root). Its post-backward hook,
    which would reduce-scatter and free, hangs on the flat parameter's `AccumulateGrad`,
    which `torch.autograd.grad` never runs: the gradients stay this rank's own, and a hook
    of ours frees each unit's unsharded flat parameter once its gradient is whole (no later
    part of backward reads it), so the probe holds about one unit's at a time, as FSDP2's
    does. The canary's coordinates are of the unpadded unsharded flat parameters, the
    same on every rank. Reads FSDP1's `_handle` and `_runtime_utils._reshard` (private,
    as of torch 2.13, checked by the tests)."""
    from torch.distributed.fsdp._runtime_utils import _reshard

    handles = [(unit, unit._handle) for unit in units if unit._handle is not None]

    def freer(unit: Any, handle: Any) -> Any:
        def free(gradient: torch.Tensor) -> None:
            _reshard(unit, handle, handle.uses_sharded_strategy)

        return free

    hooks = [handle.flat_param.register_hook(freer(unit, handle)) for unit, handle in handles]
    # FSDP1's pre-backward sets each sharded `.grad` aside to accumulate onto it, and its
    # end-of-backward puts it back only where a post-backward ran: none did. The same
    # tensors (no copy) are put back after the probe.
    grads = [(handle.flat_param, handle.flat_param.grad) for _, handle in handles]
    try:
        yield FlatView(root, handles)
    finally:
        for hook in hooks:
            hook.remove()
        for flat_param, grad in grads:
            flat_param.grad = grad


class FlatView(nn.Module):
    """The canary's view of an FSDP1 model: its parameters are the flat parameters (named
    as the root names them), `gradient_sizes` their unsharded sizes; calling it calls the
    root wrapper. Only for `torchcheck.canary`."""

    _target: nn.Module

    def __init__(self, root: nn.Module, handles: list[tuple[Any, Any]]) -> None:
        super().__init__()
        object.__setattr__(self, "_target", root)
        self.training = root.training
        flat = {id(handle.flat_param) for _, handle in handles}
        self._params = [
            (n, p) for n, p in root.named_parameters() if id(p) in flat and p.requires_grad
        ]
        # A FlatParameter's size while the probe runs: unsharded, without padding.
        self._sizes = [
            p._unpadded_unsharded_size.numel()  # type: ignore[attr-defined]
            for _, p in self._params
        ]

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        for name, param in self._params:
            yield (f"{prefix}.{name}" if prefix else name), param

    def gradient_sizes(self) -> list[int]:
        """The elements of each parameter's gradient in the probe (its unsharded size)."""
        return list(self._sizes)

    def train(self, mode: bool = True) -> FlatView:
        self._target.train(mode)
        self.training = mode
        return self

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._target(*args, **kwargs)
