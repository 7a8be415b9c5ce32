"""examples/fsdp_train.py under torchrun against the real stack: FSDP2 on CPU ranks (gloo).
The reporter derives each rank's shard key, the server compares each shard's replicas'
checksums and every rank's canary (the probe's whole-model gradient), and a hidden fault is
named with its rank and shard.

Mostly 6 ranks, 3 replicas x 2 shards (HSDP): a corrupt weight is named by its parameter
checksum, which needs three replicas of a shard (with two, a corrupt replica and a healthy
one are one against one, and the detector names both, as ambiguous). Rank r is replica
r // 2, shard r % 2, so ranks 1, 3 and 5 hold shard 1 and ranks 0, 2 and 4 shard 0. A wrong
backward is named by the canary, compared across all ranks: 4 ranks suffice, even with no
replicas at all."""

from __future__ import annotations

import sys
import time
from collections import defaultdict

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from apps.alerts.models import Alert
from apps.alerts.services import alerts_evaluate
from apps.dashboard.selectors.runs import checksum_agreement
from apps.runs.models import Run, StepReport
from detectors.config import DEFAULT_CONFIG
from launcher.procs import wait_until
from tests.agent.conftest import REPO
from tests.agent.torchrun import run_ok

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]

STEPS, CHECK_EVERY, REPLICAS, RANKS = 30, 5, 3, 6
FLIP_RANK, FLIP_STEP = 3, 12  # replica 1, shard 1: its shard's replicas are ranks 1 and 5


def train(
    url: str, secret: str, tmp_path, run: str, *fault: str, ranks: int = RANKS, replicas=REPLICAS
) -> None:
    token_file = tmp_path / f"{run}.token"
    token_file.write_text(secret)
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *("--nproc-per-node", str(ranks), str(REPO / "examples" / "fsdp_train.py")),
        "--",  # ends torchrun's options: its parser would take `--run` for `--run-path`
        *("--server", url, "--token-file", str(token_file), "--run", run),
        *("--replicas", str(replicas), "--steps", str(STEPS), "--check-every", str(CHECK_EVERY)),
        *("--spool-dir", str(tmp_path / run), *fault),
    ]
    run_ok(command)


def checked_reports(token, run: str, ranks: int = RANKS) -> dict[int, dict[int, StepReport]]:
    """{step: {rank: report}} of the checked steps, once every rank's reports are stored."""

    def rows():
        return list(StepReport.objects.filter(run__cluster=token.cluster, run__name=run))

    wait_until(lambda: len(rows()) == STEPS * ranks, 90, f"{STEPS * ranks} reports of {run}")
    checked: dict[int, dict[int, StepReport]] = defaultdict(dict)
    for row in rows():
        if row.step % CHECK_EVERY == 0:
            checked[row.step][row.rank] = row
    assert sorted(checked) == list(range(0, STEPS, CHECK_EVERY))
    return checked


def shard_keys(checked, shards: int = 2) -> dict[int, str]:
    """Each rank's key, after checking that the replicas of a shard share one, the shards
    differ, and all name one canary group."""
    keys = {row.rank: row.shard for ranks in checked.values() for row in ranks.values()}
    for shard in range(shards):
        assert {keys[r] for r in keys if r % shards == shard} == {keys[shard]}
        assert keys[shard].startswith(f"fsdp2-shard={shard}of{shards}-")
    assert len({keys[shard] for shard in range(shards)}) == shards
    assert len({key.split(";canary=all-")[1] for key in keys.values()}) == 1
    return keys


def sdc_alerts(token, checked) -> dict[int, Alert]:
    """The detectors' pass as of the last check, as the beat's pass during the run saw it
    (the run has ended since, and a pass now would leave an ended run alone)."""
    last = max(row.ts for ranks in checked.values() for row in ranks.values())
    alerts_evaluate(cluster=token.cluster, now=last.timestamp() + 1e-3, as_of=True)
    return {a.rank: a for a in Alert.objects.filter(cluster=token.cluster, kind="sdc")}


def page_rows(token, run: str) -> list[dict]:
    """The run page's table of disagreeing ranks, a row per checked step."""
    found = Run.objects.get(cluster=token.cluster, name=run)
    return checksum_agreement(run=found, start=time.time() - 3600, end=time.time() + 60)


def test_a_weight_flipped_in_one_shard_names_its_rank_and_shard(live_stack, agent_token, tmp_path):
    token, secret = agent_token
    flip = ("--flip-param-rank", str(FLIP_RANK), "--flip-param-step", str(FLIP_STEP))
    train(live_stack.url, secret, tmp_path, "fsdp-flip", *flip)
    checked = checked_reports(token, "fsdp-flip")
    keys = shard_keys(checked)
    for step, ranks in checked.items():
        params = {rank: row.param_checksum for rank, row in ranks.items()}
        for replicas in ((0, 2, 4), (1, 3, 5)):  # a healthy shard's replicas agree
            healthy = [params[r] for r in replicas if not (r == FLIP_RANK and step >= FLIP_STEP)]
            assert len(set(healthy)) == 1
        assert (params[FLIP_RANK] != params[1]) == (step >= FLIP_STEP)
        assert len({ranks[r].grad_checksum for r in (1, 3, 5)}) == 1  # reduced: spread

    alerts = sdc_alerts(token, checked)
    culprit = alerts[FLIP_RANK]
    assert culprit.evidence["shard"] == keys[FLIP_RANK]
    assert culprit.evidence["cause"] == "the replica's weights were corrupted"
    assert not culprit.evidence["ambiguous"]
    assert f"rank {FLIP_RANK} on " in culprit.summary
    assert f" of shard {keys[FLIP_RANK]} disagrees" in culprit.summary
    # Nobody else is named: not the healthy replicas of its shard, nor its replica's other
    # rank (2), which all-gathers the flipped weight but whose canary a lowest-bit flip
    # moves far less than the canary's tolerance.
    assert set(alerts) == {FLIP_RANK}

    # The run page's table names the rank within its shard at every check after the flip.
    run = Run.objects.get(cluster=token.cluster, name="fsdp-flip")
    rows = checksum_agreement(run=run, start=time.time() - 3600, end=time.time() + 60)
    after = [row for row in rows if row["step"] >= FLIP_STEP]
    assert after and all(row["param"] == [FLIP_RANK] for row in after)
    assert all(f"{FLIP_RANK} in {keys[FLIP_RANK]}" in row["where"] for row in after)
    assert all(not row["param"] for row in rows if row["step"] < FLIP_STEP)
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("op", password="x" * 20))
    page = client.get(f"/clusters/{token.cluster.name}/runs/fsdp-flip/?range=all")
    assert page.status_code == 200
    assert f"{FLIP_RANK} in {keys[FLIP_RANK]}" in page.content.decode()


def test_a_wrong_backward_on_one_rank_names_it_alone(live_stack, agent_token, tmp_path):
    token, secret = agent_token
    train(live_stack.url, secret, tmp_path, "fsdp-perturbed", "--perturb-grad-rank", "4")
    checked = checked_reports(token, "fsdp-perturbed")
    keys = shard_keys(checked)
    for ranks in checked.values():
        # the reductions spread its error: the checksums agree within each shard
        for replicas in ((0, 2, 4), (1, 3, 5)):
            assert len({ranks[r].grad_checksum for r in replicas}) == 1
            assert len({ranks[r].param_checksum for r in replicas}) == 1

    alerts = sdc_alerts(token, checked)
    assert set(alerts) == {4}
    assert alerts[4].evidence["shard"] == keys[4]
    assert alerts[4].evidence["cause"] == "the GPU computes wrong gradients"
    assert not alerts[4].evidence["ambiguous"]


def test_a_large_corruption_gathered_by_its_peer_names_its_holder_alone(
    live_stack, agent_token, tmp_path
):
    # Rank 3's weight doubles or halves (its lowest exponent bit): rank 2, in its replica,
    # all-gathers it, and both canaries move past the tolerance (by 4e-4 here), alike.
    # Only rank 3's parameter checksum disagrees (with ranks 1 and 5): rank 2 computed
    # right with what it was given, and is not named.
    token, secret = agent_token
    flip = ("--flip-param-rank", "3", "--flip-param-step", str(FLIP_STEP))
    train(live_stack.url, secret, tmp_path, "fsdp-large", *flip, "--flip-param-bit", "23")
    checked = checked_reports(token, "fsdp-large")
    after = [ranks for step, ranks in checked.items() if step >= FLIP_STEP]
    norms = {r: after[0][r].canary_norm for r in range(RANKS)}
    rtol = DEFAULT_CONFIG.sdc_canary_rtol
    assert abs(norms[2] - norms[3]) <= rtol * abs(norms[3])  # the same corrupt model
    assert abs(norms[2] - norms[0]) > 2 * rtol * abs(norms[0])  # past the healthy replicas'
    alerts = sdc_alerts(token, checked)
    assert set(alerts) == {3}
    assert alerts[3].evidence["cause"] == "the replica's weights were corrupted"
    assert not alerts[3].evidence["ambiguous"]
    # The run page's table follows the same rule: rank 3's canary and weights, not rank 2.
    after = [row for row in page_rows(token, "fsdp-large") if row["step"] >= FLIP_STEP]
    assert after and all(row["param"] == [3] and row["canary"] == [3] for row in after)


def test_with_two_replicas_a_wrong_backward_is_named_a_flipped_weight_is_not_told_apart(
    live_stack, agent_token, tmp_path
):
    # 4 ranks, 2 replicas x 2 shards. Rank 1's wrong backward: its canary is one against
    # three, named alone. Rank 2's flipped weight: its parameter checksum is one against one
    # in shard 0, so the detector names both ranks of that shard as ambiguous, each with its
    # shard, and leaves shard 1's other rank (3) alone.
    token, secret = agent_token
    run = "fsdp-two-replicas"
    faults = ("--perturb-grad-rank", "1", "--flip-param-rank", "2")
    faults += ("--flip-param-step", str(FLIP_STEP))
    train(live_stack.url, secret, tmp_path, run, *faults, ranks=4, replicas=2)
    checked = checked_reports(token, run, ranks=4)
    keys = shard_keys(checked)
    alerts = sdc_alerts(token, checked)
    assert set(alerts) == {0, 1, 2}
    assert alerts[1].evidence["cause"] == "the GPU computes wrong gradients"
    assert not alerts[1].evidence["ambiguous"] and alerts[1].evidence["shard"] == keys[1]
    for rank, peer in ((0, 2), (2, 0)):
        assert alerts[rank].evidence["ambiguous"] and alerts[rank].evidence["peers"] == [peer]
        assert alerts[rank].evidence["shard"] == keys[0]


def test_four_ranks_each_its_own_shard_name_a_wrong_backward(live_stack, agent_token, tmp_path):
    # Plain FSDP2 over 4 ranks: no two ranks hold the same bytes, so no checksum has a
    # peer; the canaries (each the whole model's gradient of the probe) do. Rank 2's wrong
    # backward is named alone. Rank 1's flipped weight is not named, nor anyone for it: no
    # other rank holds those bytes, and every rank all-gathers the same flipped copy.
    token, secret = agent_token
    run = "fsdp-four-shards"
    faults = ("--perturb-grad-rank", "2", "--flip-param-rank", "1")
    faults += ("--flip-param-step", str(FLIP_STEP))
    train(live_stack.url, secret, tmp_path, run, *faults, ranks=4, replicas=1)
    checked = checked_reports(token, run, ranks=4)
    keys = shard_keys(checked, shards=4)
    alerts = sdc_alerts(token, checked)
    assert set(alerts) == {2}
    assert alerts[2].evidence["cause"] == "the GPU computes wrong gradients"
    assert not alerts[2].evidence["ambiguous"] and alerts[2].evidence["shard"] == keys[2]
    assert "rank 2 on " in alerts[2].summary
    # The run page's table names it at every check, across the four shards.
    rows = page_rows(token, run)
    assert len(rows) == STEPS // CHECK_EVERY
    assert all(row["canary"] == [2] and not row["param"] and not row["grad"] for row in rows)
    assert all(row["where"] == [f"2 in {keys[2]}"] for row in rows)
