"""Shard keys and shard-local checks on real sharded layouts: tests/agent/shard_layouts.py
under torchrun, 4 CPU ranks (gloo), each layout split 2 x 2 into replicas and shards, each
rank's step report as its Reporter would have sent it."""

from __future__ import annotations

import json
import math
import sys
from types import SimpleNamespace

import pytest
from torch import nn

from opsboard_agent import torchshard
from opsboard_agent.reporter import Reporter
from tests.agent.conftest import REPO, closed_port_url
from tests.agent.torchrun import run_ok

RANKS = 4
SAME_SHARD = ((0, 2), (1, 3))  # rank = replica * 2 + shard: (0, 2) and (1, 3) are replicas


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict[str, dict[int, dict]]:
    out = tmp_path_factory.mktemp("layouts")
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *("--nproc-per-node", str(RANKS), str(REPO / "tests" / "agent" / "shard_layouts.py")),
        str(out),
    ]
    run_ok(command)
    found: dict[str, dict[int, dict]] = {}
    for path in out.glob("*-rank*.json"):
        name, rank = path.stem.split("-rank")
        found.setdefault(name, {})[int(rank)] = json.loads(path.read_text())
    return found


def sent(layout: dict[int, dict], field: str) -> dict[int, object]:
    return {rank: result["sent"].get(field) for rank, result in layout.items()}


def canary_close(a: dict, b: dict, rel: float = 1e-6) -> bool:
    return all(
        math.isclose(x, y, rel_tol=rel, abs_tol=1e-12)
        for x, y in zip([a["norm"], *a["proj"]], [b["norm"], *b["proj"]], strict=True)
    )


def assert_replicas_of_a_shard_agree(layout: dict[int, dict], prefix: str) -> None:
    """Equal key and checksums within each shard's replicas, different across shards."""
    keys = sent(layout, "shard")
    assert sorted(keys) == list(range(RANKS))
    for field in ("shard", "grad_checksum", "param_checksum"):
        values = sent(layout, field)
        for a, b in SAME_SHARD:
            assert values[a] and values[a] == values[b], (field, values)
        assert values[0] != values[1], (field, values)
    for rank, key in keys.items():
        assert isinstance(key, str) and len(key) <= 128
        assert key.startswith(f"{prefix}{rank % 2}of2-"), key


def test_ddp_ranks_send_no_shard_and_all_agree(layouts):
    ddp = layouts["ddp"]
    assert set(sent(ddp, "shard").values()) == {None}
    for field in ("grad_checksum", "param_checksum"):
        assert len(set(sent(ddp, field).values())) == 1
    canaries = sent(ddp, "canary")
    assert all(canary_close(canaries[0], canaries[rank]) for rank in range(RANKS))


def test_hsdp_replicas_of_a_shard_share_a_key_and_agree(layouts):
    assert_replicas_of_a_shard_agree(layouts["hsdp"], "fsdp2-shard=")


def test_an_fsdp2_key_names_one_canary_group_for_every_shard(layouts):
    # The probe unshards the model: every rank's canary is the whole model's, so the key
    # names a canary group (after ";canary=") that FSDP's coordinates are left out of.
    keys = sent(layouts["hsdp"], "shard")
    groups = {key.split(";canary=")[1] for key in keys.values()}  # type: ignore[union-attr]
    assert len(groups) == 1 and groups.pop().startswith("all-")
    assert all(len(key) <= 128 for key in keys.values())  # type: ignore[arg-type]
    fsdp1 = {key.split(";canary=")[1] for key in sent(layouts["fsdp1"], "shard").values()}  # type: ignore[union-attr]
    assert len(fsdp1) == 1 and fsdp1.pop().startswith("all-")  # FSDP1's probe: unsharded too
    for name in ("tp", "pp"):  # a canary of the rank's own slice: its shard's
        assert all(";canary=" not in key for key in sent(layouts[name], "shard").values())


def test_the_fsdp2_canary_is_the_full_local_gradient_of_the_probe(layouts):
    # Unsharded for the probe, every rank computes the whole model's gradient: the same on
    # every healthy rank, and the same as an unsharded copy of the model gives.
    for result in layouts["hsdp"].values():
        assert canary_close(result["sent"]["canary"], result["reference"])
        assert len(result["sent"]["canary"]["proj"]) == 4


def test_fsdp1_hybrid_shards_are_keyed_by_their_rank_in_the_shard_group(layouts):
    assert_replicas_of_a_shard_agree(layouts["fsdp1"], "fsdp1=")


def test_the_fsdp1_canary_is_the_full_local_gradient_of_the_probe(layouts):
    # Probed through the root wrapper a unit at a time: every rank computes the whole
    # model's gradient, over the flat parameters' coordinates (so only the norm matches an
    # unsharded copy's), and the training's sharded gradients are left as they were.
    canaries = sent(layouts["fsdp1"], "canary")
    for rank, result in layouts["fsdp1"].items():
        assert canary_close(canaries[rank], canaries[0], rel=1e-12)
        assert math.isclose(canaries[rank]["norm"], result["reference"]["norm"], rel_tol=1e-9)
        assert result["grads_kept"]


def test_tensor_parallel_replicas_share_a_key_and_agree(layouts):
    tp = layouts["tp"]
    assert_replicas_of_a_shard_agree(tp, "tp=")
    canaries = sent(tp, "canary")
    for a, b in SAME_SHARD:
        assert canary_close(canaries[a], canaries[b])
    assert not canary_close(canaries[0], canaries[1])
    # The canary is the norm of exactly the local shards of the probe's full gradient.
    for result in tp.values():
        assert math.isclose(result["sent"]["canary"]["norm"], result["local_norm"], rel_tol=1e-6)


def test_fsdp2_with_tensor_parallel_compares_canaries_by_tp_coordinate(layouts):
    # 2-D: "dp" sharded by FSDP2, "tp" by tensor parallelism; every rank holds a different
    # shard (no checksum has a peer), and the probe unshards "dp" only: each canary is its
    # TP slice of the probe's full gradient, the same on the ranks of one TP coordinate.
    layout = layouts["fsdp_tp"]
    keys = sent(layout, "shard")
    assert len(set(keys.values())) == RANKS
    groups = {rank: key.split(";canary=")[1] for rank, key in keys.items()}  # type: ignore[union-attr]
    canaries = sent(layout, "canary")
    for a, b in SAME_SHARD:  # rank = dp * 2 + tp: (0, 2) and (1, 3) share a TP coordinate
        assert keys[a].startswith(f"fsdp2-dp={a // 2}of2-tp={a % 2}of2-")  # type: ignore[union-attr]
        assert groups[a] == groups[b] and groups[a].startswith(f"tp={a % 2}of2-")
        assert canary_close(canaries[a], canaries[b], rel=1e-12)
    assert groups[0] != groups[1] and not canary_close(canaries[0], canaries[1])
    for result in layout.values():
        assert math.isclose(result["sent"]["canary"]["norm"], result["local_norm"], rel_tol=1e-6)


def test_pipeline_stages_are_keyed_apart_and_their_replicas_agree(layouts):
    pp = layouts["pp"]
    assert_replicas_of_a_shard_agree(pp, "pp=")
    canaries = sent(pp, "canary")
    for a, b in SAME_SHARD:
        assert canary_close(canaries[a], canaries[b])
    assert not canary_close(canaries[0], canaries[1])


@pytest.mark.parametrize("name", ["ddp", "hsdp", "fsdp1", "tp", "pp", "fsdp_tp"])
def test_a_bit_flipped_in_a_local_shard_changes_that_ranks_checksum_only(layouts, name):
    layout = layouts[name]
    after = {rank: result["flipped"] for rank, result in layout.items()}
    before = sent(layout, "param_checksum")
    assert after[2] != before[2]  # rank 2 flipped one bit of its own shard
    assert all(after[rank] == before[rank] for rank in (0, 1, 3))


def test_an_unsharded_module_has_no_shard_key_and_is_digested_as_it_is():
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    assert torchshard.shard_key(model) is None
    assert torchshard.local_view(model) is model
    with torchshard.canary_view(model, sum) as (module, loss_fn):
        assert module is model and loss_fn is sum


def test_a_pipeline_stage_is_keyed_by_its_index_within_the_contracts_bound():
    part = nn.Linear(4, 4)
    stage = SimpleNamespace(submod=part, stage_index=1, num_stages=4)
    key = torchshard.shard_key(stage)
    assert key is not None and key.startswith("pp=1of4-") and len(key) == len("pp=1of4-") + 12
    assert torchshard.shard_key(SimpleNamespace(submod=part, stage_index=2, num_stages=4)) != key
    assert torchshard.local_view(stage) is part
    huge = SimpleNamespace(submod=part, stage_index=10**200, num_stages=10**201)
    assert len(torchshard.shard_key(huge) or "") == 128


def reporter_for(tmp_path, closed_url: str, **kwargs) -> Reporter:
    return Reporter(
        run="r", server=closed_url, token="t", node="n", rank=1, world_size=2,
        spool_dir=tmp_path, flush_interval=3600, commands=False, **kwargs,
    )  # fmt: skip


def sent_steps(reporter: Reporter) -> list[dict]:
    assert reporter.shipper is not None
    reporter.shipper.flush()
    batches = sorted(reporter.shipper.spool.directory.glob("*.batch"))
    return [step for path in batches for step in json.loads(path.read_bytes()).get("steps", [])]


@pytest.fixture
def derived(monkeypatch) -> list[object]:
    """The models the reporter derived a shard key from (each answered `key-<n>`)."""
    seen: list[object] = []

    def shard_key(model):
        seen.append(model)
        return f"key-{len(seen)}"

    monkeypatch.setattr(torchshard, "shard_key", shard_key)
    return seen


def test_the_reporter_derives_the_key_once_per_model_and_sends_it(tmp_path, derived):
    reporter = reporter_for(tmp_path, closed_port_url())
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    reporter.step(0)  # before any check: nothing derived yet
    reporter.record_param_checksum(first)
    reporter.record_grad_checksum(first)
    reporter.step(1)
    reporter.record_param_checksum(second)  # another model: derived again
    reporter.step(2)
    assert derived == [first, second]
    assert [step.get("shard") for step in sent_steps(reporter)] == [None, "key-1", "key-2"]
    reporter.close(drain_timeout=0, state=None)


def test_a_shard_given_to_the_reporter_wins(tmp_path, derived):
    reporter = reporter_for(tmp_path, closed_port_url(), shard="tp0-pp0")
    reporter.record_param_checksum(nn.Linear(2, 2))
    reporter.step(0)
    assert derived == [] and reporter.reported_shard == "tp0-pp0"
    assert sent_steps(reporter)[0]["shard"] == "tp0-pp0"
    reporter.close(drain_timeout=0, state=None)
