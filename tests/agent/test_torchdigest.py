"""The on-device digest behind grad_checksum / param_checksum (CPU torch; the arithmetic is
exact integer arithmetic, so what holds here holds on every device)."""

import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from opsboard_agent import torchcheck, torchdigest
from opsboard_agent.torchdigest import digest

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.uint8,
    torch.bool,
]
# Small chunks so that tests cross chunk boundaries with tensors of a few KiB.
SMALL = {"chunk_rows": 2, "batch_rows": 1}
CHUNK_WORDS = 2 * torchdigest.ROW_WORDS


def sample(dtype: torch.dtype, count: int = 3000, seed: int = 0) -> torch.Tensor:
    """`count` distinct-looking values of `dtype` (3000 words or more: several rows)."""
    generator = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(count, generator=generator).to(dtype)
    if dtype == torch.bool:
        return torch.rand(count, generator=generator) > 0.5
    high = 256 if dtype == torch.uint8 else 2**40
    return torch.randint(0, high, (count,), generator=generator, dtype=dtype)


def flipped(tensor: torch.Tensor, element: int, bit: int) -> torch.Tensor:
    out = tensor.clone()
    raw = out.view(torch.uint8)
    byte = element * tensor.element_size() + bit // 8
    raw[byte] ^= 1 << (bit % 8)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_it_changes_when_any_bit_of_an_element_flips(dtype):
    tensor = sample(dtype)
    elements = [0, 1, 1023, 1024, 2047, tensor.numel() - 1]
    seen = {digest([("t", tensor)])}
    for element in elements:
        for bit in range(8 * tensor.element_size()):
            seen.add(digest([("t", flipped(tensor, element, bit))]))
    assert len(seen) == 1 + len(elements) * 8 * tensor.element_size()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_it_changes_when_two_elements_swap(dtype):
    tensor = sample(dtype, count=8000)
    base = digest([("t", tensor)], **SMALL)
    pairs = [(0, 1), (0, 2), (5, 1000), (10, 3000), (1, 7999)]  # one row, rows, chunks
    for a, b in pairs:
        if torch.equal(tensor[a], tensor[b]):
            continue
        swapped = tensor.clone()
        swapped[a], swapped[b] = tensor[b], tensor[a]
        assert digest([("t", swapped)], **SMALL) != base, (a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_it_changes_when_opposite_signs_swap(dtype):
    # Values differing only in their top bit: the case a plain weighted sum modulo 2**64
    # cannot see, since 2**63 times any odd weight is 2**63 again.
    tensor = torch.ones(64, dtype=dtype)
    tensor[1::2] = -1.0
    base = digest([("t", tensor)])
    for a, b in [(0, 1), (2, 5), (10, 63)]:
        swapped = tensor.clone()
        swapped[a], swapped[b] = tensor[b], tensor[a]
        assert digest([("t", swapped)]) != base


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_it_tells_negative_zero_and_nan_payloads_apart(dtype):
    zeros = torch.zeros(4, dtype=dtype)
    assert digest([("t", zeros)]) != digest([("t", -zeros)])
    nan = torch.full((4,), float("nan"), dtype=dtype)
    other = nan.clone()
    other.view(torch.uint8)[0] ^= 1  # lowest mantissa bit: still a NaN, another payload
    assert torch.isnan(other).all()
    assert digest([("t", nan)]) != digest([("t", other)])


def test_names_dtypes_shapes_and_order_are_part_of_it():
    tensor = torch.arange(24, dtype=torch.float32)
    base = digest([("a", tensor)])
    assert digest([("b", tensor)]) != base
    assert digest([("a", tensor.view(torch.int32))]) != base  # same bits, another dtype
    assert digest([("a", tensor.view(4, 6))]) != base
    assert digest([("a", tensor.view(6, 4))]) != digest([("a", tensor.view(4, 6))])
    pair = [("a", tensor), ("b", tensor + 1)]
    assert digest(pair) != digest(pair[::-1])
    assert digest([("a", torch.empty(0))]) != digest([("a", torch.empty(0, 3))])


@pytest.mark.parametrize("words", [1, 1023, 1024, 1025, 2047, 2048, 2049, 4095, 4096, 4097])
def test_chunk_boundaries_do_not_collide(words):
    tensor = torch.randn(words, generator=torch.Generator().manual_seed(words))
    base = digest([("t", tensor)], **SMALL)
    assert base == digest([("t", tensor)], chunk_rows=2, batch_rows=2)
    if words > 1:
        assert digest([("t", tensor.roll(1))], **SMALL) != base
        last = tensor.clone()
        last[-1], last[-2] = tensor[-2], tensor[-1]
        assert digest([("t", last)], **SMALL) != base
    padded = torch.cat([tensor, torch.zeros(1)])  # a zero more is another shape
    assert digest([("t", padded)], **SMALL) != base


def test_a_value_moved_across_a_chunk_boundary_changes_it():
    tensor = torch.zeros(3 * CHUNK_WORDS)
    tensor[CHUNK_WORDS - 1] = 1.0
    moved = torch.zeros_like(tensor)
    moved[CHUNK_WORDS] = 1.0
    assert digest([("t", tensor)], **SMALL) != digest([("t", moved)], **SMALL)
    # The same place in the next chunk: the row keys repeat, the chunk vectors do not.
    again = torch.zeros_like(tensor)
    again[2 * CHUNK_WORDS - 1] = 1.0
    assert digest([("t", tensor)], **SMALL) != digest([("t", again)], **SMALL)


@pytest.mark.parametrize("batch_rows", [1, 2, 4, 256, 4096])
def test_the_batch_a_device_takes_changes_the_cost_not_the_result(batch_rows):
    tensor = torch.randn(3 * 4096 * 1024 + 77, generator=torch.Generator().manual_seed(5))
    assert digest([("t", tensor)], batch_rows=batch_rows) == digest([("t", tensor)])


def views() -> list[torch.Tensor]:
    base = torch.randn(37, 53, generator=torch.Generator().manual_seed(3))
    wide = torch.randn(5000, 3, generator=torch.Generator().manual_seed(4))
    half = torch.randn(301, generator=torch.Generator().manual_seed(6)).half()
    return [
        base.t(),  # transposed
        base[::2, 1::3],  # strided
        torch.randn(1, 53).expand(37, 53),  # stride 0
        torch.randn(2, 3, 17, 19).to(memory_format=torch.channels_last),
        wide.t(),  # rows of 5000 elements: longer than a 1,024-word piece
        half[1:],  # contiguous, at an odd offset: not viewable as int32
        torch.arange(13, dtype=torch.uint8)[3:],  # 10 bytes: a padded last word
        torch.randn(4, 6, dtype=torch.complex64).t(),
    ]


@pytest.mark.parametrize("view", views(), ids=lambda v: f"{v.dtype}{tuple(v.stride())}")
def test_non_contiguous_tensors_digest_like_their_contiguous_copy(view):
    copy = view.contiguous().clone()
    for options in ({}, {"batch_rows": 1}, SMALL):
        assert digest([("v", view)], **options) == digest([("v", copy)], **options)


def test_it_is_the_same_in_a_fresh_process():
    script = (
        "import torch; from opsboard_agent.torchdigest import digest;"
        "g = torch.Generator().manual_seed(11);"
        "print(digest([('w', torch.randn(70000, generator=g)), ('b', torch.arange(9))]))"
    )
    generator = torch.Generator().manual_seed(11)
    here = digest([("w", torch.randn(70000, generator=generator)), ("b", torch.arange(9))])
    there = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert there == here


def test_the_format_is_pinned():
    # Replicas must agree across hosts, Python and torch versions: the weight tables come
    # from Python's own generator. A change here changes every checksum a run reports.
    tensors = [("w", torch.arange(5000, dtype=torch.float32)), ("b", torch.arange(7))]
    assert digest(tensors) == "26405c1e26ac72800cdfb86040cc3959"


def test_one_host_copy_per_check(monkeypatch):
    copies = []
    original = torch.Tensor.cpu

    def counted(self, *args, **kwargs):
        copies.append(tuple(self.shape))
        return original(self, *args, **kwargs)

    def forbidden(self, *args, **kwargs):
        raise AssertionError("a host sync per value")

    monkeypatch.setattr(torch.Tensor, "cpu", counted)
    monkeypatch.setattr(torch.Tensor, "item", forbidden)
    monkeypatch.setattr(torch.Tensor, "tolist", forbidden)
    tensors = [(f"t{n}", torch.randn(3000 * n + 1)) for n in range(1, 6)]
    digest(tensors, **SMALL)
    assert len(copies) == 1


def test_a_sharded_tensor_digests_its_local_shard():
    local = torch.randn(100)

    class Sharded:  # what DTensor offers: the shard this rank holds
        def to_local(self):
            return local

    assert digest([("p", Sharded())]) == digest([("p", local)])  # type: ignore[list-item]


def test_the_weight_tables_keep_their_guarantees():
    weights, keys = torchdigest.tables(torch.device("cpu"))
    as_ints = weights.to(torch.int64)
    assert torch.equal(as_ints.double(), weights)
    assert bool((as_ints % 2 == 1).all()) and int(as_ints.abs().max()) <= 2047
    assert len({tuple(row) for row in as_ints.tolist()}) == torchdigest.ROW_WORDS
    blocks = weights.view(-1, 4, torchdigest.LANES)
    assert bool((torch.linalg.det(blocks).abs() > 0.5).all())
    assert bool((keys % 2 != 0).all())


def test_torchcheck_delegates_and_keeps_its_format():
    model = torch.nn.Linear(3, 2)
    value = torchcheck.param_checksum(model)
    assert value == digest(list(model.named_parameters()))
    assert len(value) == 32 and int(value, 16) >= 0


@settings(max_examples=200, deadline=None)
@given(
    dtype=st.sampled_from([torch.float32, torch.float16, torch.float64, torch.uint8]),
    count=st.integers(1, 5000),
    data=st.data(),
)
def test_any_single_element_change_changes_it(dtype, count, data):
    tensor = sample(dtype, count=count, seed=count)
    element = data.draw(st.integers(0, count - 1))
    bits = 8 * tensor.element_size()
    raw = data.draw(st.integers(0, 2**bits - 1))
    changed = tensor.clone()
    target = changed.view(torch.uint8)[element * (bits // 8) : (element + 1) * (bits // 8)]
    old = bytes(target.tolist())
    new = raw.to_bytes(bits // 8, "little")
    if old == new:
        return
    target.copy_(torch.tensor(list(new), dtype=torch.uint8))
    assert digest([("t", changed)], **SMALL) != digest([("t", tensor)], **SMALL)
