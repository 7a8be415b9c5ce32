"""Silent data corruption: checksums and canaries that disagree with the replicas."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors import sdc
from tests.detectors.builders import cluster, last_ts, run, steps

PROJ = (0.125, -0.872, 0.0431, 1.502)


def checks(bad: dict | None = None, *, shard=lambda r: None, every: int = 10, noise=None):
    """Every `every` steps, equal checksums and canaries; `bad` maps (rank, step) → fields
    to override (or rank → fields for every check)."""
    bad = bad or {}

    def extra(rank: int, step: int) -> dict:
        if step % every:
            return {"shard": shard(rank)}
        wobble = noise(rank, step) if noise else 0.0
        fields = {
            "grad_checksum": f"g{step}-{shard(rank)}",
            "param_checksum": f"p{step}-{shard(rank)}",
            "canary_norm": 3.0412 * (1 + wobble),
            "canary_proj": tuple(p * (1 + wobble) for p in PROJ),
            "shard": shard(rank),
        }
        fields.update(bad.get((rank, step), bad.get(rank, {})))
        return fields

    return extra


def findings(extra, ranks: int = 16, count: int = 40):
    rows = steps(ranks=ranks, count=count, extra=extra)
    return sdc.detect(cluster(run(rows)), last_ts(rows))


def test_it_finds_nothing_when_replicas_agree():
    assert findings(checks()) == []


def test_a_wrong_canary_with_equal_params_means_wrong_gradients():
    (f,) = findings(checks({5: {"canary_norm": 3.2}}))
    assert f.kind == "sdc" and f.subject == "run:r/rank:5" and f.node == "n0"
    assert "the GPU computes wrong gradients" in f.summary and "rank 5 on n0" in f.summary
    assert f.evidence["disagreed"] == {"canary": 4} and f.severity == "critical"


def test_a_diverged_param_checksum_means_corrupted_weights():
    (f,) = findings(checks({9: {"param_checksum": "bad"}}))
    assert "the replica's weights were corrupted" in f.summary and f.rank == 9


def test_a_grad_checksum_alone_means_corruption_after_the_reduction():
    (f,) = findings(checks({9: {"grad_checksum": "bad"}}))
    assert f.evidence["cause"] == "corruption after the reduction"


@pytest.mark.parametrize(("bad_checks", "severity"), [(1, "warning"), (2, "critical")])
def test_it_is_critical_from_two_disagreeing_checks(bad_checks, severity):
    bad = {(4, step): {"param_checksum": "x"} for step in (30, 20)[:bad_checks]}
    (f,) = findings(checks(bad))
    assert f.severity == severity and f.evidence["checks_disagreed"] == bad_checks


@pytest.mark.parametrize(("rel", "expected"), [(0.9e-4, 0), (1.1e-4, 1)])
def test_canaries_agree_within_the_relative_tolerance(rel, expected):
    assert len(findings(checks({7: {"canary_norm": 3.0412 * (1 + rel)}}))) == expected


def test_only_ranks_of_the_same_shard_are_compared():
    shard = lambda r: f"tp{r % 2}"  # noqa: E731
    assert findings(checks(shard=shard)) == []  # the two shards' checksums differ
    (f,) = findings(checks({3: {"param_checksum": "x"}}, shard=shard))
    assert f.rank == 3 and f.evidence["shard"] == "tp1"


def test_two_replicas_that_disagree_are_both_ambiguous():
    shard = lambda r: f"s{r // 2}"  # noqa: E731  (groups of 2)
    found = findings(checks({6: {"param_checksum": "x"}}, shard=shard))
    assert [f.rank for f in found] == [6, 7]
    assert all(f.evidence["ambiguous"] for f in found)
    assert "no majority" in found[0].summary and "rank 7" in found[0].summary


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32))
def test_healthy_canary_noise_gives_no_finding(seed):
    import random

    rng = random.Random(seed)
    noise = {(r, s): rng.uniform(-1e-7, 1e-7) for r in range(16) for s in range(0, 40, 10)}
    assert findings(checks(noise=lambda r, s: noise[(r, s)])) == []


@settings(max_examples=30, deadline=None)
@given(st.permutations(list(range(16))), st.integers(0, 15))
def test_permuting_ranks_permutes_the_suspect(perm, culprit):
    rows = steps(
        ranks=16,
        count=30,
        extra=checks({culprit: {"param_checksum": "x"}}),
        rank_of=perm.__getitem__,
    )
    (f,) = sdc.detect(cluster(run(rows)), last_ts(rows))
    assert f.rank == perm[culprit]


def test_two_corrupt_replicas_of_four_are_blamed_not_the_healthy_pair():
    # examples/ddp_train.py's case: rank 1 computes wrong gradients, rank 2's weights flip
    bad = {1: {"canary_norm": 3.2}, 2: {"param_checksum": "flipped", "canary_norm": 3.5}}
    found = findings(checks(bad), ranks=4)
    assert [(f.rank, f.evidence["cause"], f.evidence["ambiguous"]) for f in found] == [
        (1, "the GPU computes wrong gradients", False),
        (2, "the replica's weights were corrupted", False),
    ]


def test_a_split_two_against_two_stays_ambiguous():
    found = findings(checks({2: {"param_checksum": "x"}, 3: {"param_checksum": "x"}}), ranks=4)
    assert [f.rank for f in found] == [0, 1, 2, 3]
    assert all(f.evidence["ambiguous"] for f in found)


def test_a_check_is_judged_only_once_every_replica_reported_it():
    bad = {1: {"canary_norm": 3.2}, 2: {"param_checksum": "flipped", "canary_norm": 3.5}}
    rows = steps(ranks=4, count=31, extra=checks(bad))
    # the newest check (step 30) lacks rank 3's report: ranks 0, 1, 2 all differ there
    partial = [row for row in rows if not (row.step == 30 and row.rank == 3)]
    found = sdc.detect(cluster(run(partial)), last_ts(partial))
    assert sorted(f.rank for f in found) == [1, 2]
    assert all(30 not in f.evidence["steps"] for f in found)
    # once every rank has moved past it, a still missing report no longer holds it back
    later = [*partial, *(r for r in steps(ranks=4, count=33, extra=checks(bad)) if r.step > 30)]
    found = sdc.detect(cluster(run(later)), last_ts(later))
    assert all(30 in f.evidence["steps"] for f in found)


def fsdp(shards: int):
    """An FSDP job's keys: rank r holds shard r % `shards`, every canary in one group."""
    return lambda r: f"fsdp2-shard={r % shards}of{shards}-0123456789ab;canary=*"


def test_an_fsdp_canary_is_compared_across_shards():
    # 4 ranks, each its own shard: no checksum has a peer, the canaries (each the whole
    # model's local gradient of the probe) all do.
    found = findings(checks({2: {"canary_norm": 3.2}}, shard=fsdp(4)), ranks=4)
    assert [(f.rank, f.evidence["ambiguous"]) for f in found] == [(2, False)]
    assert found[0].evidence["shard"] == fsdp(4)(2)
    assert found[0].evidence["cause"] == "the GPU computes wrong gradients"
    # Without the canary group, each rank is alone: nothing can be said.
    plain = lambda r: f"fsdp2-shard={r}of4-0123456789ab"  # noqa: E731
    assert findings(checks({2: {"canary_norm": 3.2}}, shard=plain), ranks=4) == []


def test_peers_that_gathered_a_corrupt_shard_are_not_blamed_for_their_canaries():
    # HSDP 3 x 2 (rank r: replica r // 2, shard r % 2): rank 3's weights are corrupt, and
    # rank 2, its replica's other rank, all-gathers them: both canaries move, alike.
    moved = {"canary_norm": 3.5}
    bad = {3: {"param_checksum": "corrupt", **moved}, 2: moved}
    found = findings(checks(bad, shard=fsdp(2)), ranks=6)
    assert [(f.rank, f.evidence["cause"]) for f in found] == [
        (3, "the replica's weights were corrupted")
    ]
    # A wrong backward beside it is still named: its canary is not the corrupt one's.
    bad[4] = {"canary_norm": 3.2}
    found = findings(checks(bad, shard=fsdp(2)), ranks=6)
    assert [f.rank for f in found] == [3, 4]
    # 2 x 2: rank 2's corrupt shard 0 is one against one (0 and 2, ambiguous); rank 3
    # gathered it, rank 1 did not: neither is named.
    bad = {2: {"param_checksum": "corrupt", **moved}, 3: moved}
    found = findings(checks(bad, shard=fsdp(2)), ranks=4)
    assert [(f.rank, f.evidence["ambiguous"]) for f in found] == [(0, True), (2, True)]
