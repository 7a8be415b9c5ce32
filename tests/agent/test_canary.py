"""The canary without a float64 concatenation: the same numbers as the implementation that
concatenated the whole local gradient (kept here as the reference), in bounded memory."""

import math

import pytest
import torch
from torch import nn

from opsboard_agent import torchcheck


def concatenating_canary(model, loss_fn, *, projections=4, seed=0):
    """The implementation before issue 28, verbatim but for the name: the reference."""
    module = torchcheck.unwrap(model)
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
    result = {"norm": float(torch.linalg.vector_norm(flat)), "proj": []}
    generator = torch.Generator(device="cpu").manual_seed(seed)
    count = min(flat.numel(), torchcheck.PROJECTION_COORDS)
    for _ in range(projections):
        index = torch.randint(flat.numel(), (count,), generator=generator)
        weights = torch.randn(count, generator=generator, dtype=torch.float64)
        value = float((flat[index.to(flat.device)] * weights.to(flat.device)).sum())
        result["proj"].append(value / math.sqrt(count))
    return result


class Mixed(nn.Module):
    """bf16 and fp32 parameters, a frozen one, an unused one, a non-contiguous one."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(16, 32)
        self.bf16 = nn.Linear(32, 32).to(torch.bfloat16)
        self.frozen = nn.Linear(32, 32)
        self.frozen.requires_grad_(False)
        self.unused = nn.Linear(7, 7)
        self.transposed = nn.Parameter(torch.randn(8, 32).t())

    def forward(self, x):
        hidden = torch.tanh(self.first(x))
        hidden = self.bf16(hidden.to(torch.bfloat16)).float()
        return self.frozen(hidden) @ self.transposed


def models():
    torch.manual_seed(0)
    return {
        "mlp": nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)),
        "wider than the sample": nn.Sequential(nn.Linear(300, 400), nn.Tanh(), nn.Linear(400, 3)),
        "mixed": Mixed(),
    }


def probe(module):
    width = next(m for m in module.modules() if isinstance(m, nn.Linear)).in_features
    inputs = torch.randn(16, width, generator=torch.Generator().manual_seed(1))
    return module(inputs).square().mean()


@pytest.mark.parametrize("name", list(models()))
@pytest.mark.parametrize("seed", [0, 7])
def test_it_equals_the_concatenating_canary(name, seed):
    model = models()[name]
    expected = concatenating_canary(model, probe, projections=6, seed=seed)
    got = torchcheck.canary(model, probe, projections=6, seed=seed)
    assert got["norm"] == pytest.approx(expected["norm"], rel=1e-9)
    # The same products summed in the same order: equal, not merely close.
    assert got["proj"] == expected["proj"]


def test_the_projections_are_fixed_by_the_seed():
    model = models()["wider than the sample"]
    first = torchcheck.canary(model, probe, seed=3)
    assert torchcheck.canary(model, probe, seed=3) == first
    other = torchcheck.canary(model, probe, seed=4)
    assert other["norm"] == first["norm"] and other["proj"] != first["proj"]


def test_a_wrong_gradient_on_one_module_moves_it():
    healthy, faulty = models()["mixed"], models()["mixed"]
    faulty.first.weight.register_hook(lambda grad: grad * (1 + 1e-3))
    good = torchcheck.canary(healthy, probe)
    bad = torchcheck.canary(faulty, probe)
    assert bad["norm"] != good["norm"]
    assert any(abs(b - g) > 1e-6 * abs(g) for b, g in zip(bad["proj"], good["proj"], strict=True))


def test_it_leaves_the_gradients_and_the_rng_alone():
    model = models()["mixed"]
    probe(model).backward()
    grads = [p.grad.clone() if p.grad is not None else None for p in model.parameters()]
    state = torch.get_rng_state()
    torchcheck.canary(model, probe)
    assert torch.equal(state, torch.get_rng_state())
    for before, param in zip(grads, model.parameters(), strict=True):
        assert (before is None and param.grad is None) or torch.equal(before, param.grad)


def test_one_host_copy_per_canary(monkeypatch):
    model = models()["wider than the sample"]
    copies = []
    original = torch.Tensor.cpu

    def counted(self, *args, **kwargs):
        copies.append(tuple(self.shape))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", counted)
    torchcheck.canary(model, probe)
    assert copies == [(5,)]  # the norm and four projections, together


def test_no_gradient_outlives_its_hook(monkeypatch):
    # What autograd.grad returns is an expanded zero per parameter (no memory): each
    # gradient was read by the canary's hook as backward produced it, then dropped.
    expected = concatenating_canary(models()["mixed"], probe)
    returned = []
    original = torch.autograd.grad

    def recording(*args, **kwargs):
        grads = original(*args, **kwargs)
        returned.extend(grads)
        return grads

    monkeypatch.setattr(torch.autograd, "grad", recording)
    model = models()["mixed"]
    assert torchcheck.canary(model, probe)["proj"] == expected["proj"]
    kept = [g for g in returned if g is not None]
    assert kept and all(set(g.stride()) == {0} for g in kept)
    assert all(not p._backward_hooks for p in model.parameters())  # hooks removed


def test_a_model_without_trainable_parameters_gives_zeros():
    frozen = nn.Linear(3, 3).requires_grad_(False)
    assert torchcheck.canary(frozen, lambda m: m(torch.ones(1, 3)).sum()) == {
        "norm": 0.0,
        "proj": [0.0] * 4,
    }
