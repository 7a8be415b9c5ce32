"""What a training process tells about itself: how it is exiting, its environment's integers,
and which of the node's GPUs it drives."""

from __future__ import annotations

import os
import sys
from typing import Any


class ExitState:
    """Whether the interpreter is exiting on an uncaught exception: sys.excepthook runs
    before atexit hooks, so a wrapper around it records the failure and its message."""

    failure: str | None = None
    _installed = False

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        cls._installed = True
        previous = sys.excepthook

        def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
            cls.failure = f"{kind.__name__}: {value}"[:8000]
            previous(kind, value, tb)

        sys.excepthook = hook


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip().lstrip("-").isdigit() else default


GPU_MAX = 63  # the contract's bound of a GPU index


def node_gpu(device: int) -> int | None:
    """A process's CUDA device index as the node numbers its GPUs (the node agent's, NVML's
    index): through CUDA_VISIBLE_DEVICES when it lists indices; None for -1 or out of range."""
    visible = [part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    if device >= 0 and all(part.isdigit() for part in visible) and device < len(visible):
        device = int(visible[device])
    return device if 0 <= device <= GPU_MAX else None
