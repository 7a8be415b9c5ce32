"""The reporter names its rank's GPU in every step report: the current CUDA device once
torch has initialised CUDA, else LOCAL_RANK (through a numeric CUDA_VISIBLE_DEVICES)."""

import json

import pytest

from opsboard_agent.reporter import Reporter


def spooled_steps(reporter: Reporter) -> list[dict]:
    reporter.shipper.flush()
    spool = reporter.shipper.spool
    return [
        step
        for seq in sorted(spool._entries)
        for step in json.loads((spool.directory / f"{seq:012d}.batch").read_bytes())["steps"]
    ]


@pytest.fixture
def env_reporter(tmp_path, loopback, monkeypatch):
    """Reporter.from_env against a server that keeps every batch in the spool (503)."""
    loopback.routes["/api/v1/ingest"] = lambda request: (503, {"Retry-After": "60"}, b"{}")
    monkeypatch.setenv("OPSBOARD_SERVER", loopback.url)
    monkeypatch.setenv("OPSBOARD_SPOOL_DIR", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    made = []

    def make() -> Reporter:
        made.append(Reporter.from_env(run="r", token="t", flush_interval=60, commands=False))
        return made[-1]

    yield make
    for reporter in made:
        reporter.close(drain_timeout=0)


def test_it_fills_gpu_from_local_rank(env_reporter, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    reporter = env_reporter()
    reporter.step(1, step_time=0.5)
    assert [step["gpu"] for step in spooled_steps(reporter)] == [3]


def test_it_maps_local_rank_through_cuda_visible_devices(env_reporter, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    reporter = env_reporter()
    reporter.step(1, step_time=0.5)
    assert [step["gpu"] for step in spooled_steps(reporter)] == [6]


def test_it_sends_no_gpu_when_it_knows_none(env_reporter, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    reporter = env_reporter()
    reporter.step(1, step_time=0.5)
    assert ["gpu" in step for step in spooled_steps(reporter)] == [False]


def test_the_current_cuda_device_wins_once_cuda_is_initialised(env_reporter, monkeypatch):
    # CUDA is not there in CI: a stand-in for torch.cuda's two calls the reporter makes
    import sys
    import types

    cuda = types.SimpleNamespace(initialised=False)
    cuda.is_initialized = lambda: cuda.initialised
    cuda.current_device = lambda: 2
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setenv("LOCAL_RANK", "0")
    reporter = env_reporter()
    reporter.step(1, step_time=0.5)
    cuda.initialised = True
    reporter.step(2, step_time=0.5)
    assert [step["gpu"] for step in spooled_steps(reporter)] == [0, 2]
