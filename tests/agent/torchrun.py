"""Running a torchrun (or any) job of a test as a subprocess, from the repository."""

import os
import subprocess

from tests.agent.conftest import REPO


def run_ok(command: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    """`command` run from the repository with it on PYTHONPATH; its exit status must be 0
    (else the end of its stderr is the failure's message)."""
    result = subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result
