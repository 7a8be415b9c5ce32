"""A bit-exact digest of tensors computed where they live, at memory bandwidth.

The checksums of the contract (`grad_checksum`, `param_checksum`) must agree bit for bit
between healthy replicas and differ when one bit differs. Copying every tensor to the host
and hashing it there costs a device-to-host copy of the model and runs at one CPU core's
BLAKE2b speed (0.27-0.69 GB/s), so the digest is computed on the device with torch ops and
only a few bytes per 16 MiB cross to the host:

1. Each tensor's raw bytes, in logical element order, are read as little-endian int32
   words, laid out in rows of `ROW_WORDS` words (the last row zero-padded).
2. Each row is multiplied by a fixed `ROW_WORDS x LANES` matrix of small odd integers, in
   float64. The words are integers below 2**31 and the weights below 2**11, so every
   product and partial sum is an integer below 2**52: float64 holds it exactly, whatever
   order a BLAS (MKL, cuBLAS) sums in. The result is exact integer arithmetic, the same on
   every device, at GEMM speed. The float64 values are never the tensor's own floats, so
   NaN payloads and -0.0 survive as the integers they are.
3. The rows of each `CHUNK_ROWS`-row chunk are weighted by fixed random odd int64s and
   summed with int64 wraparound: one `LANES`-vector per chunk.
4. All chunk vectors are stacked on the device and copied to the host once (the one sync
   of a check), then hashed with each tensor's name, dtype and shape by BLAKE2b into the
   32 hex characters the contract has always carried.

What is proven rather than likely: a change to any single element of any dtype up to 16
bytes changes the digest (the weights are nonzero, each aligned 4-row block of them is
nonsingular, so a row's exact product moves, and an odd int64 weight keeps a nonzero
integer below 2**53 nonzero modulo 2**64); so does swapping two different elements of up to
4 bytes within one row (the weight rows are pairwise distinct) or any two in different
chunks (each chunk is hashed on its own: each sees a one-element change). Other changes
collide with odds of about 2**-33 per lane, four lanes, on top of BLAKE2b.

The batch a device processes at once (`batch_rows`) changes the cost, never the result.
"""

from __future__ import annotations

import ctypes
import hashlib
import random
from collections.abc import Iterable, Iterator
from fractions import Fraction

import torch

ROW_WORDS = 1024  # 2**10 words a row: with weights < 2**11 a row's sum stays < 2**52
CHUNK_ROWS = 4096  # 16 MiB of words a chunk: one LANES-vector crosses to the host per chunk
LANES = 4
WEIGHT_MAX = 2047  # |weight| < 2**11
SEED = 0x5DC0_28A1  # the tables are part of the format: every replica must draw the same
# Rows digested at once: as many as keep the float64 copy of a batch under 1/256 of the
# bytes checked (fewer kernel launches, and fewer parallel regions, which cost a scheduler
# tick each on a busy CPU), between 64 rows (256 KiB of words) and a whole chunk. On 2 CPU
# cores a batch of 128 rows digests at ~3 GB/s, one of 2,048 at ~5.9.
TEMPORARY_SHARE = 1 / 256
MIN_BATCH_ROWS = 64
PERSON = b"opsboard-dig-v2"  # BLAKE2b personalisation: this scheme, not the old byte hash

_tables: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}


def digest(
    tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    batch_rows: int | None = None,
    chunk_rows: int = CHUNK_ROWS,
) -> str:
    """Hex digest (32 chars) of names, dtypes, shapes and raw bits, in the given order.

    Computed on each tensor's device with one host copy per device at the end; equal
    inputs give equal digests on every device type and for every `batch_rows`."""
    items = [(name, local_tensor(tensor).detach()) for name, tensor in tensors]
    if batch_rows is None:
        nbytes = sum(t.numel() * t.element_size() for _, t in items)
        batch_rows = auto_batch_rows(nbytes, chunk_rows)
    scratch = _scratch(items, min(batch_rows, chunk_rows) * ROW_WORDS)
    headers: list[tuple[bytes, torch.device, int]] = []  # header, device, chunk vectors
    partials: dict[torch.device, list[torch.Tensor]] = {}
    for name, data in items:
        vectors = tensor_partials(
            data, batch_rows=batch_rows, chunk_rows=chunk_rows, scratch=scratch[data.device]
        )
        if vectors:
            partials.setdefault(data.device, []).extend(vectors)
        header = f"{name}:{data.dtype}:{tuple(data.shape)};".encode()
        headers.append((header, data.device, len(vectors)))
    # The one host sync per device: every chunk vector of every tensor in one copy.
    host = {device: torch.stack(vectors).cpu() for device, vectors in partials.items()}
    taken = dict.fromkeys(host, 0)
    out = hashlib.blake2b(digest_size=16, person=PERSON)
    for header, device, count in headers:
        out.update(header)
        if count:
            rows = host[device][taken[device] : taken[device] + count]
            taken[device] += count
            out.update(ctypes.string_at(rows.data_ptr(), rows.numel() * rows.element_size()))
    return out.hexdigest()


def _scratch(items: list[tuple[str, torch.Tensor]], batch_words: int) -> dict:
    """One float64 buffer per device for the whole check, as long as its longest batch:
    a buffer a tensor, freed in between, can leave the allocator holding one per tensor."""
    words: dict[torch.device, int] = {}
    for _, tensor in items:
        need = min(batch_words, -(-tensor.numel() * tensor.element_size() // 4))
        words[tensor.device] = max(words.get(tensor.device, 0), need)
    return {
        device: torch.empty(count, dtype=torch.float64, device=device)
        for device, count in words.items()
    }


def auto_batch_rows(nbytes: int, chunk_rows: int = CHUNK_ROWS) -> int:
    """The power of two of rows whose float64 copy stays under `TEMPORARY_SHARE` of
    `nbytes`, within [MIN_BATCH_ROWS, chunk_rows]."""
    fits = int(nbytes * TEMPORARY_SHARE) // (8 * ROW_WORDS)
    return max(MIN_BATCH_ROWS, min(chunk_rows, 1 << max(0, fits.bit_length() - 1)))


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The part of `tensor` this process holds: a DTensor's local shard, else the tensor."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def tensor_partials(
    tensor: torch.Tensor,
    *,
    batch_rows: int | None = None,
    chunk_rows: int = CHUNK_ROWS,
    scratch: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """One int64 `(LANES,)` vector per chunk of `tensor`'s words, left on its device.
    `scratch`: float64, at least a batch long (or the tensor's words, if fewer)."""
    if tensor.numel() == 0:
        return []
    if batch_rows is None:
        batch_rows = auto_batch_rows(tensor.numel() * tensor.element_size(), chunk_rows)
    rows = min(batch_rows, chunk_rows)
    if chunk_rows % rows:
        raise ValueError(f"batch_rows {rows} must divide chunk_rows {chunk_rows}")
    weights, row_keys = tables(tensor.device, chunk_rows)
    batch_words = rows * ROW_WORDS
    if scratch is None:  # float64 copies of the words land here: one allocation, not per batch
        words = min(batch_words, -(-tensor.numel() * tensor.element_size() // 4))
        scratch = torch.empty(words, dtype=torch.float64, device=tensor.device)
    # A chunk's row products gather here and are weighted once the chunk is complete: a
    # batch costs a conversion and a GEMM, nothing more.
    products = torch.empty((chunk_rows, LANES), dtype=torch.float64, device=tensor.device)
    vectors: list[torch.Tensor] = []
    pending = 0  # rows of the current chunk in `products`
    per_batch = batch_words * 4 // tensor.element_size()
    for number, piece in enumerate(logical_pieces(tensor, per_batch)):
        start = number * rows % chunk_rows
        pending = start + _row_products(as_words(piece), weights, scratch, products[start:])
        if pending == chunk_rows:
            vectors.append(_chunk_vector(products, row_keys, pending))
            pending = 0
    if pending:
        vectors.append(_chunk_vector(products, row_keys, pending))
    return vectors


def _row_products(
    words: torch.Tensor, weights: torch.Tensor, scratch: torch.Tensor, out: torch.Tensor
) -> int:
    """Each row of `words` times the weight matrix into `out`'s first rows, as float64
    exact integers; returns how many rows."""
    full, tail = divmod(words.numel(), ROW_WORDS)
    exact = scratch[: words.numel()]
    exact.copy_(words)  # int32 -> float64: exact
    if full:
        torch.mm(exact[: full * ROW_WORDS].view(full, ROW_WORDS), weights, out=out[:full])
    if tail:
        # the zero padding of the last row contributes nothing, so it is left out
        out[full] = exact[full * ROW_WORDS :] @ weights[:tail]
    return full + (tail > 0)


def _chunk_vector(products: torch.Tensor, row_keys: torch.Tensor, rows: int) -> torch.Tensor:
    """A chunk's `(LANES,)` vector: its rows' products weighted by the row keys, summed
    with int64 wraparound."""
    return (products[:rows].to(torch.int64) * row_keys[:rows]).sum(0)


def logical_pieces(tensor: torch.Tensor, elements: int) -> Iterator[torch.Tensor]:
    """Contiguous 1-D pieces of `elements` elements (the last shorter) in logical order.

    Views of a contiguous tensor; of any other, copies of at most three pieces' size, so a
    transposed or strided tensor digests like its contiguous copy without one being made."""
    count = tensor.numel()
    flat = tensor.reshape(-1) if tensor.is_contiguous() else None
    for start in range(0, count, elements):
        end = min(count, start + elements)
        yield flat[start:end] if flat is not None else _logical_range(tensor, start, end)


def _logical_range(tensor: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Elements `[start, end)` of `tensor` in logical order, as a contiguous 1-D tensor."""
    if tensor.is_contiguous():
        return tensor.reshape(-1)[start:end]
    if tensor.dim() <= 1:
        return tensor.reshape(-1)[start:end].contiguous() if tensor.dim() else tensor.reshape(1)
    row = tensor[0].numel()
    if row <= end - start:
        # Whole rows around the range: a copy of at most (end - start) + 2 rows.
        first, last = start // row, -(-end // row)
        return tensor[first:last].reshape(-1)[start - first * row : end - first * row]
    parts = []  # the range is shorter than a row: it spans one or two of them
    for index in range(start // row, (end - 1) // row + 1):
        offset = index * row
        parts.append(
            _logical_range(
                tensor[index], max(start, offset) - offset, min(end, offset + row) - offset
            )
        )
    return torch.cat(parts) if len(parts) > 1 else parts[0].contiguous()


def as_words(piece: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-D piece's bytes as int32 words: a view when aligned, else a copy
    zero-padded to whole words (odd byte counts, pieces at odd offsets)."""
    piece = piece.resolve_conj().resolve_neg()
    size = piece.element_size()
    nbytes = piece.numel() * size
    if nbytes % 4 == 0 and piece.storage_offset() * size % 4 == 0:
        return piece.view(torch.int32)
    words = torch.zeros(-(-nbytes // 4), dtype=torch.int32, device=piece.device)
    words.view(torch.uint8)[:nbytes].copy_(piece.view(torch.uint8))
    return words


def tables(device: torch.device, chunk_rows: int = CHUNK_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed `(ROW_WORDS, LANES)` float64 weights and `(chunk_rows, LANES)` int64 row
    keys on `device`, drawn once from `SEED` by Python's own generator (stable across
    Python and torch versions, so every replica draws the same)."""
    key = (torch.device(device), chunk_rows)
    if key not in _tables:
        rng = random.Random(SEED)
        weights = _weight_rows(rng)
        row_keys = [[_odd_int64(rng) for _ in range(LANES)] for _ in range(chunk_rows)]
        _tables[key] = (
            torch.tensor(weights, dtype=torch.float64, device=key[0]),
            torch.tensor(row_keys, dtype=torch.int64, device=key[0]),
        )
    return _tables[key]


def _weight_rows(rng: random.Random) -> list[list[int]]:
    """Odd weights in [-WEIGHT_MAX, WEIGHT_MAX], rows pairwise distinct, every aligned
    block of 4 rows (one 16-byte element) nonsingular; redrawn until so."""
    rows: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    while len(rows) < ROW_WORDS:
        block = [[_odd_weight(rng) for _ in range(LANES)] for _ in range(4)]
        keys = {tuple(row) for row in block}
        if len(keys) == 4 and not keys & seen and _determinant(block) != 0:
            rows.extend(block)
            seen |= keys
    return rows


def _odd_weight(rng: random.Random) -> int:
    magnitude = 2 * rng.getrandbits(WEIGHT_MAX.bit_length() - 1) + 1  # odd, <= WEIGHT_MAX
    return -magnitude if rng.getrandbits(1) else magnitude


def _odd_int64(rng: random.Random) -> int:
    value = rng.getrandbits(64) | 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _determinant(matrix: list[list[int]]) -> Fraction:
    """Exact, by Gaussian elimination over the rationals (4x4: a few dozen operations)."""
    rows = [[Fraction(value) for value in row] for row in matrix]
    result = Fraction(1)
    for column in range(len(rows)):
        pivot = next((r for r in range(column, len(rows)) if rows[r][column]), None)
        if pivot is None:
            return Fraction(0)
        if pivot != column:
            rows[column], rows[pivot] = rows[pivot], rows[column]
            result = -result
        result *= rows[column][column]
        for r in range(column + 1, len(rows)):
            factor = rows[r][column] / rows[column][column]
            rows[r] = [a - factor * b for a, b in zip(rows[r], rows[column], strict=True)]
    return result
