"""The real peers the tests start (Prometheus, Alertmanager, Slurm and munge, from Debian's
packages): found on PATH, or the test fails in CI, which installs them (.ci/run), and is
skipped elsewhere with the apt-get line that installs them."""

from __future__ import annotations

import os
import shutil

import pytest


def peer_binaries(*names: str, install: str, any_of: bool = False) -> list[str]:
    """The paths of `names` (with `any_of`, of the first one found, alone)."""
    found = [path for path in map(shutil.which, names) if path is not None]
    if (found and any_of) or len(found) == len(names):
        return found[:1] if any_of else found
    missing = [name for name in names if shutil.which(name) is None]
    message = f"{' or '.join(missing) if any_of else ', '.join(missing)} not installed; "
    message += f"install with `{install}`"
    if os.environ.get("CI"):
        pytest.fail(f"CI runs this test against the real server, but {message}")
    pytest.skip(message)
