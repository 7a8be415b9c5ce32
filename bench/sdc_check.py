"""What the silent-data-corruption checks cost at 0.1, 1 and 4 B parameters, old beside new.

The old checks (kept here only, for this comparison): the checksums copied every tensor to
the host and hashed its bytes with BLAKE2b; the canary concatenated the whole local
gradient into one float64 tensor. The new ones (opsboard_agent.torchcheck): the digest
reduces each tensor's bits on its device (opsboard_agent.torchdigest), the canary gathers
its sampled coordinates gradient by gradient.

The models are stacks of fp32 Linear(4096, 4096) layers built directly (no training): a
copy of one random layer, scaled so activations keep their size, gradients set by copy.
What does not fit in memory is measured at the largest size that does and extrapolated
linearly per GB (every check here is linear in the parameter bytes); the output says so.
Peak extra memory at a check: the process's resident high-water mark (VmHWM, reset before
each check through /proc/self/clear_refs) above its resident size before the check; on
CUDA, torch's peak allocated bytes. The temporaries of the new checks are also counted.

Run: python bench/sdc_check.py [--device cuda] [--quick] [--sizes 0.1,1,4] [--memory-gb N]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import hashlib
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opsboard_agent import torchcheck, torchdigest  # noqa: E402

WIDTH = 4096
CHECK_EVERY = 100
TOKENS = 16384  # tokens a replica processes per step: 8 sequences of 2,048
GPU_FLOPS = 1e14  # a GPU sustaining 100 TFLOP/s: a 1 B model's step then takes 0.98 s
OLD_CANARY_BYTES = 24  # weights 4 + gradients 4 + float64 pieces 8 + their concatenation 8
NEW_BYTES = 8  # weights + gradients (the digest's own temporaries are a few MiB)
GB = 1e9
TABLE_BYTES = (torchdigest.ROW_WORDS + torchdigest.CHUNK_ROWS) * torchdigest.LANES * 8


def old_tensors_digest(tensors) -> str:
    """torchcheck.tensors_digest before issue 28: host copy, BLAKE2b on one core."""
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


def old_canary(model, loss_fn, *, projections: int = 4, seed: int = 0) -> dict:
    """torchcheck.canary before issue 28: the whole gradient concatenated in float64."""
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.enable_grad():
        grads = torch.autograd.grad(loss_fn(model), params, allow_unused=True)
    flat = torch.cat(
        [
            (g if g is not None else torch.zeros_like(p)).reshape(-1).to(torch.float64)
            for g, p in zip(grads, params, strict=True)
        ]
    )
    del grads
    result: dict = {"norm": float(torch.linalg.vector_norm(flat)), "proj": []}
    generator = torch.Generator(device="cpu").manual_seed(seed)
    count = min(flat.numel(), torchcheck.PROJECTION_COORDS)
    for _ in range(projections):
        index = torch.randint(flat.numel(), (count,), generator=generator)
        weights = torch.randn(count, generator=generator, dtype=torch.float64)
        value = float((flat[index.to(flat.device)] * weights.to(flat.device)).sum())
        result["proj"].append(value / math.sqrt(count))
    return result


@dataclass(frozen=True)
class Figure:
    """One check at one size: wall and CPU seconds, peak extra bytes, weight bytes."""

    seconds: float
    cpu_seconds: float
    peak: int
    weights: int

    def scaled(self, factor: float) -> Figure:
        return Figure(self.seconds * factor, self.cpu_seconds * factor, self.peak, self.weights)


class Memory:
    """Peak resident (or CUDA-allocated) bytes of one call above what was there before."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.libc = ctypes.CDLL("libc.so.6") if sys.platform == "linux" else None

    def measure(self, call, weights: int) -> Figure:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        else:
            if self.libc is not None:
                self.libc.malloc_trim(0)  # free heap back to the system: RSS is what is used
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
            before = psutil.Process().memory_info().rss
        started, cpu_started = time.perf_counter(), time.process_time()
        call()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated() - before
        else:
            peak = _vm_hwm() - before
        return Figure(seconds, cpu, peak, weights)


def _vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def build_model(params: float, device: torch.device, width: int) -> nn.Sequential:
    """About `params` parameters of Linear(width, width) layers, `.grad` set on each."""
    layers = max(1, round(params / (width * width + width)))
    model = nn.Sequential(*(nn.Linear(width, width, device="meta") for _ in range(layers)))
    model.to_empty(device=device)
    bound = math.sqrt(3 / width)  # unit gain: activations neither vanish nor blow up
    template = torch.empty(width, width, device=device).uniform_(-bound, bound)
    with torch.no_grad():
        for layer in model:
            layer.weight.copy_(template)
            layer.bias.zero_()
            layer.weight.grad = layer.weight.detach().clone()
            layer.bias.grad = layer.bias.detach().clone()
    return model


def probe_loss(device: torch.device, width: int):
    probe = torch.randn(4, width, generator=torch.Generator().manual_seed(1)).to(device)
    return lambda module: module(probe).square().mean()


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def fitting(wanted: float, bytes_per_param: int, budget: float) -> float:
    """The largest of wanted, wanted/2, ... whose working set fits in `budget` bytes."""
    params = wanted
    while params * bytes_per_param > budget and params > 2e7:
        params /= 2
    return params


def reference_flops(device: torch.device) -> float:
    """Sustained matmul rate of `device` (fp32 on CPU, bf16 on CUDA), for the step model."""
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    a = torch.randn(2048, 2048, device=device, dtype=dtype)
    a @ a
    best = math.inf
    for _ in range(3):
        started = time.perf_counter()
        a @ a
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return 2 * 2048**3 / best


def time_best(memory: Memory, call, repeats: int, weights: int) -> Figure:
    """The fastest of `repeats` calls, with the peak extra bytes of the first."""
    first = fastest = memory.measure(call, weights)
    for _ in range(repeats - 1):
        fastest = min(fastest, memory.measure(call, weights), key=lambda f: f.seconds)
    return Figure(fastest.seconds, fastest.cpu_seconds, first.peak, weights)


def digest_figures(model, memory: Memory, repeats: int) -> dict[str, Figure]:
    """The grad and param checksums, old and new."""
    grads = [(name, p.grad) for name, p in model.named_parameters()]
    params = list(model.named_parameters())
    weights = param_count(model) * 4
    calls = {
        "grad old": lambda: old_tensors_digest(grads),
        "grad new": lambda: torchdigest.digest(grads),
        "param old": lambda: old_tensors_digest(params),
        "param new": lambda: torchdigest.digest(params),
    }
    return {key: time_best(memory, call, repeats, weights) for key, call in calls.items()}


def canary_figure(model, loss_fn, memory: Memory, which: str) -> Figure:
    for p in model.parameters():
        p.grad = None  # the canary's gradients are its own
    check = old_canary if which == "old" else torchcheck.canary
    check(model, loss_fn)  # warm-up: the first backward allocates its workspaces
    return time_best(memory, lambda: check(model, loss_fn), 2, param_count(model) * 4)


def measure(new_fit: float, old_fit: float, device: torch.device, options) -> dict:
    """Every check at the sizes that fit: the checksums and the new canary at `new_fit`
    parameters, the old canary at `old_fit`."""
    memory = Memory(device)
    model = build_model(new_fit, device, options.width)
    out: dict = digest_figures(model, memory, options.repeats)
    loss_fn = probe_loss(device, options.width)
    out["canary new"] = canary_figure(model, loss_fn, memory, "new")
    if param_count(model) > old_fit * 1.01:
        del model
        model = build_model(old_fit, device, options.width)
    out["canary old"] = canary_figure(model, loss_fn, memory, "old")
    return out


def scaled(raw: dict[str, Figure], wanted: float) -> dict[str, Figure]:
    """`raw` extrapolated to `wanted` parameters: seconds scale with the bytes, peaks not."""
    return {key: figure.scaled(wanted * 4 / figure.weights) for key, figure in raw.items()}


def share(seconds: float, params: float, flops: float) -> float:
    """Checks every CHECK_EVERY steps as a share of a step of 6 x params x TOKENS / flops."""
    return seconds / CHECK_EVERY / (6 * params * TOKENS / flops)


def report(figures: dict[str, Figure], wanted: float, flops: float, device) -> None:
    gigabytes = wanted * 4 / GB
    print(f"\n== {wanted / 1e9:g} B parameters, fp32, {gigabytes:.1f} GB of weights")
    for which in ("grad new", "canary old"):
        measured = figures[which].weights / 4
        if abs(measured - wanted) > 0.03 * wanted:
            print(
                f"   {'checksums and new canary' if which == 'grad new' else 'old canary'}: "
                f"measured at {measured / 1e9:.3f} B, extrapolated x{wanted / measured:.2f}"
            )
    print(f"{'':16}{'old':>34}{'new':>34}{'new/old':>10}")
    head = f"{'s':>8}{'s/GB':>8}{'cpu-s/GB':>10}{'GB/s':>8}"
    print(f"{'check':16}{head}{head}{'time':>10}")
    for key in ("grad", "param", "canary"):
        row = f"{key if key == 'canary' else key + ' checksum':16}"
        for figure in (figures[f"{key} old"], figures[f"{key} new"]):
            rate = f"{gigabytes / figure.seconds:8.2f}" if key != "canary" else f"{'':8}"
            row += f"{figure.seconds:8.2f}{figure.seconds / gigabytes:8.3f}"
            row += f"{figure.cpu_seconds / gigabytes:10.3f}{rate}"
        print(row + f"{figures[f'{key} new'].seconds / figures[f'{key} old'].seconds:10.3f}")
    print(f"{'peak extra':16}{'MiB':>22}{'% weights':>12}{'MiB':>22}{'% weights':>12}")
    for key in ("grad", "param", "canary"):
        row = f"{key if key == 'canary' else key + ' checksum':16}"
        shares = []
        for figure in (figures[f"{key} old"], figures[f"{key} new"]):
            shares.append(figure.peak / figure.weights)
            row += f"{figure.peak / 2**20:22.1f}{100 * shares[-1]:12.2f}"
        print(row + f"{shares[1] / max(shares[0], 1e-12):10.3f}")
    _report_shares(figures, wanted, flops, device)


def _report_shares(figures: dict[str, Figure], wanted: float, flops: float, device) -> None:
    old = sum(figures[f"{k} old"].seconds for k in ("grad", "param", "canary"))
    new = sum(figures[f"{k} new"].seconds for k in ("grad", "param", "canary"))
    print(f"three checks every {CHECK_EVERY} steps: old {old:.2f} s, new {new:.2f} s a check")
    references = (
        (f"this {device.type}'s {flops / 1e12:.2f} TFLOP/s", flops),
        (f"a GPU's {GPU_FLOPS / 1e12:.0f} TFLOP/s, checks as timed here", GPU_FLOPS),
    )
    for label, rate in references:
        step = 6 * wanted * TOKENS / rate
        before, after = share(old, wanted, rate), share(new, wanted, rate)
        print(
            f"  step = 6 x params x {TOKENS} tokens / {label} = {step:.2f} s: "
            f"old {100 * before:.3f} %, new {100 * after:.3f} % of a step "
            f"(target < 1 %: {'OK' if after < 0.01 else 'OVER'})"
        )


def temporaries_counted(wanted: float) -> str:
    rows = torchdigest.auto_batch_rows(int(wanted * 4))
    words = rows * torchdigest.ROW_WORDS
    return (
        f"   digest temporaries counted: a float64 batch of {rows} rows of "
        f"{torchdigest.ROW_WORDS} words, {words * 8 / 2**20:.0f} MiB "
        f"({100 * words * 8 / (wanted * 4):.2f} % of the weights; a strided or misaligned "
        f"tensor adds its int32 copy, half that); {torchdigest.LANES * 8} bytes a 16 MiB chunk "
        f"sent to the host; weight tables {TABLE_BYTES / 2**20:.2f} MiB per device, kept"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", default="0.1,1,4", help="billions of parameters")
    parser.add_argument("--quick", action="store_true", help="1/100 of each size, one run")
    parser.add_argument(
        "--memory-gb", type=float, help="working set allowed (default: 60 %% of available)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="timed runs, the best kept")
    args = parser.parse_args()
    args.width = 1024 if args.quick else WIDTH
    args.repeats = 1 if args.quick else args.repeats
    device = torch.device(args.device)
    sizes = [float(s) * 1e9 / (100 if args.quick else 1) for s in args.sizes.split(",")]
    if device.type == "cuda":
        available = torch.cuda.mem_get_info()[0]
    else:
        available = psutil.virtual_memory().available
    budget = args.memory_gb * GB if args.memory_gb else 0.6 * available
    flops = reference_flops(device)
    print(
        f"{device} ({torch.get_num_threads()} intra-op threads), torch {torch.__version__}; "
        f"working set allowed {budget / GB:.1f} GB; sustained matmul {flops / 1e12:.2f} TFLOP/s; "
        f"load average {os.getloadavg()[0]:.2f} at the start"
    )
    # Once per process, not a check's cost: the tables drawn, BLAS and autograd warmed up.
    warm = torch.ones(torchdigest.CHUNK_ROWS * torchdigest.ROW_WORDS, device=device)
    for rows in (torchdigest.MIN_BATCH_ROWS, torchdigest.CHUNK_ROWS):
        torchdigest.digest([("warm-up", warm)], batch_rows=rows)
    del warm
    torchcheck.canary(
        nn.Linear(8, 8).to(device), lambda m: m(torch.ones(1, 8, device=device)).sum()
    )
    measured: dict[tuple[int, int], dict] = {}
    for wanted in sizes:
        fits = (
            round(fitting(wanted, NEW_BYTES, budget)),
            round(fitting(wanted, OLD_CANARY_BYTES, budget)),
        )
        if fits not in measured:  # a size that does not fit reuses the one that did
            measured[fits] = measure(*fits, device, args)
        report(scaled(measured[fits], wanted), wanted, flops, device)
        print(temporaries_counted(wanted))


if __name__ == "__main__":
    main()
