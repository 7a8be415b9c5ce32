"""The training-loop reporter and its PyTorch corruption checks (CPU torch)."""

import json
import time

import pytest
import torch
from torch import nn

from opsboard_agent import torchcheck
from opsboard_agent.reporter import Reporter


def spooled(reporter: Reporter) -> list[dict]:
    reporter.shipper.flush()
    spool = reporter.shipper.spool
    return [
        json.loads((spool.directory / f"{seq:012d}.batch").read_bytes())
        for seq in sorted(spool._entries)
    ]


@pytest.fixture
def reporter(tmp_path, loopback):
    # A server that never answers 2xx keeps everything in the spool for inspection.
    loopback.routes["/api/v1/ingest"] = lambda request: (503, {"Retry-After": "60"}, b"{}")
    rep = Reporter(
        run="run-1",
        server=loopback.url,
        token="t",
        node="node-01",
        rank=3,
        world_size=4,
        check_every=5,
        spool_dir=tmp_path,
        flush_interval=60,
    )
    yield rep
    rep.close(drain_timeout=0)


def test_it_times_phases_and_reports_a_contract_step(reporter):
    with reporter.phase("data"):
        time.sleep(0.01)
    with reporter.phase("compute"):
        time.sleep(0.02)
    with reporter.phase("compute"):
        time.sleep(0.01)
    reporter.step(10, tokens=512, loss=torch.tensor(2.5))
    reporter.step(11, loss=float("nan"))
    (batch,) = spooled(reporter)
    first, second = batch["steps"]
    assert batch["run"] == "run-1" and batch["node"] == "node-01"
    assert first["rank"] == 3 and first["step"] == 10 and first["tokens"] == 512
    assert first["loss"] == 2.5 and "loss" not in second
    assert first["data_time"] >= 0.01 and first["compute_time"] >= 0.03
    assert first["step_time"] >= first["data_time"] + first["compute_time"]
    assert "h2d_time" not in first and "data_time" not in second


def test_an_explicit_ts_and_phase_times_are_sent_as_given(reporter):
    with reporter.phase("compute"):
        time.sleep(0.001)
    reporter.step(7, ts=1_700_000_000.5, step_time=0.8, compute_time=0.6, comm_wait=0.15)
    reporter.event("restart", ts=1_700_000_001.0)
    reporter.sample("agent.x", 1.0, ts=1_700_000_002.0)
    batches = spooled(reporter)
    (step,) = [s for b in batches for s in b.get("steps", [])]
    assert (step["ts"], step["step_time"], step["compute_time"], step["comm_wait"]) == (
        1_700_000_000.5,
        0.8,
        0.6,
        0.15,
    )
    assert [e["ts"] for b in batches for e in b.get("events", [])] == [1_700_000_001.0]
    assert 1_700_000_002.0 in [x["ts"] for b in batches for x in b.get("samples", [])]


def test_it_reports_checkpoints_in_two_phases_and_ooms(reporter):
    with reporter.checkpointing(100, "local", path="/ckpt/100") as info:
        info["bytes"] = 1234
    with pytest.raises(RuntimeError), reporter.checkpointing(100, "durable"):
        raise RuntimeError("upload failed")
    with pytest.raises(torch.cuda.OutOfMemoryError), reporter.oom_guard():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    events = [e for b in spooled(reporter) for e in b.get("events", [])]
    assert [(e["kind"], e.get("tier"), e.get("state")) for e in events] == [
        ("checkpoint", "local", "started"),
        ("checkpoint", "local", "completed"),
        ("checkpoint", "durable", "started"),
        ("checkpoint", "durable", "failed"),
        ("oom", None, None),
    ]
    assert events[1]["bytes"] == 1234 and events[1]["duration"] >= 0
    assert events[4]["rank"] == 3 and "out of memory" in events[4]["message"]


def test_without_a_server_it_is_a_no_op(tmp_path):
    rep = Reporter(run="r", server=None, token=None)
    with rep.phase("data"):
        pass
    rep.step(1)
    rep.event("log", message="x")
    assert not rep.enabled
    rep.close()


def test_it_reads_the_torchrun_environment(monkeypatch, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("OPSBOARD_SERVER", "http://127.0.0.1:9")
    monkeypatch.setenv("OPSBOARD_TOKEN_FILE", str(token))
    monkeypatch.setenv("OPSBOARD_SPOOL_DIR", str(tmp_path / "spool"))
    rep = Reporter.from_env(run="r")
    assert (rep.rank, rep.local_rank, rep.world_size) == (5, 1, 8)
    assert rep.shipper.sender.token == "s3cret"
    assert rep.shipper.spool.directory == tmp_path / "spool" / "rank-5"
    rep.close(drain_timeout=0)


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Tanh(), nn.Linear(16, 1))


def probe_loss(module):
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    return module(x).pow(2).mean()


def test_checksums_are_bit_exact_and_sensitive_to_one_bit():
    a, b = make_model(), make_model()
    assert torchcheck.param_checksum(a) == torchcheck.param_checksum(b)
    assert len(torchcheck.param_checksum(a)) <= 64
    with torch.no_grad():
        next(b.parameters()).view(-1)[:1].view(torch.int32).bitwise_xor_(1)
    assert torchcheck.param_checksum(a) != torchcheck.param_checksum(b)
    for model in (a, b):
        probe_loss(model).backward()
    assert torchcheck.grad_checksum(a) != torchcheck.grad_checksum(b)


def test_the_canary_leaves_training_untouched_and_is_reproducible():
    model = make_model()
    model.train()
    probe_loss(model).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    twin = make_model()
    rng_state = torch.get_rng_state()
    first = torchcheck.canary(model, probe_loss, projections=4, seed=9)
    second = torchcheck.canary(twin, probe_loss, projections=4, seed=9)
    assert first == second and len(first["proj"]) == 4 and first["norm"] > 0
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))
    assert torch.equal(rng_state, torch.get_rng_state()) and model.training


def test_a_wrong_gradient_moves_the_canary(reporter):
    healthy = make_model()
    faulty = make_model()
    for param in faulty.parameters():
        param.register_hook(lambda grad: grad * (1 + 1e-3))
    good = reporter.record_canary(healthy, probe_loss)
    bad = torchcheck.canary(faulty, probe_loss, seed=reporter.canary_seed)
    assert abs(bad["norm"] - good["norm"]) / good["norm"] > 1e-4
    reporter.step(5)
    (batch,) = spooled(reporter)
    assert batch["steps"][0]["canary"] == good
    assert any(s["metric"] == "agent.canary_seconds" for s in batch["samples"])
