"""Settings from the environment: NAME, or the file named by NAME_FILE (for secrets)."""

import os
from pathlib import Path


def env(name: str, default: str = "") -> str:
    """A setting from NAME, or from the file named by NAME_FILE (for secrets)."""
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        return Path(file_name).read_text().strip()
    return os.environ.get(name, default)


def truthy(value: str) -> bool:
    return value.lower() in ("1", "true", "yes", "on")


def envbool(name: str, default: str) -> bool:
    return truthy(env(name, default))


def envint(name: str, default: int) -> int:
    return int(env(name, str(default)))


def envfloat(name: str, default: float) -> float:
    return float(env(name, str(default)))


def envlist(name: str, default: str) -> list[str]:
    return [item.strip() for item in env(name, default).split(",") if item.strip()]
