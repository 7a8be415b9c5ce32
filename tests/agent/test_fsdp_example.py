"""examples/fsdp_train.py under torchrun against the real stack: FSDP2 on 6 CPU ranks (gloo),
3 replicas x 2 shards (HSDP). The reporter derives each rank's shard key, the server compares
each shard's replicas only, and a hidden fault is named with its rank and shard.

Three replicas, not two: with two, a corrupt replica and a healthy one are one against one,
and nothing tells which is which (the detector then names both, as ambiguous). Rank r is
replica r // 2, shard r % 2, so ranks 1, 3 and 5 hold shard 1 and ranks 0, 2 and 4 shard 0."""

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


def shard_keys(checked) -> dict[int, str]:
    """Each rank's key, after checking that the replicas of a shard share one and the two
    shards differ."""
    keys = {row.rank: row.shard for ranks in checked.values() for row in ranks.values()}
    assert {keys[r] for r in keys if r % 2 == 0} == {keys[0]} != {keys[1]}
    assert {keys[r] for r in keys if r % 2 == 1} == {keys[1]}
    assert keys[0].startswith("fsdp2-shard=0of2-") and keys[1].startswith("fsdp2-shard=1of2-")
    return keys


def sdc_alerts(token, checked) -> dict[int, Alert]:
    """The detectors' pass as of the last check, as the beat's pass during the run saw it
    (the run has ended since, and a pass now would leave an ended run alone)."""
    last = max(row.ts for ranks in checked.values() for row in ranks.values())
    alerts_evaluate(cluster=token.cluster, now=last.timestamp() + 1e-3, as_of=True)
    return {a.rank: a for a in Alert.objects.filter(cluster=token.cluster, kind="sdc")}


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


def test_with_two_replicas_a_fault_is_seen_within_its_shard_but_not_told_apart(
    live_stack, agent_token, tmp_path
):
    # 4 ranks, 2 replicas x 2 shards: rank 2's wrong backward is one canary against one in
    # shard 0. The detector names both ranks of that shard as ambiguous, each with its shard,
    # and leaves shard 1's ranks alone (without shard keys every check would split 2-2).
    token, secret = agent_token
    run = "fsdp-two-replicas"
    train(live_stack.url, secret, tmp_path, run, "--perturb-grad-rank", "2", ranks=4, replicas=2)
    checked = checked_reports(token, run, ranks=4)
    keys = shard_keys(checked)
    alerts = sdc_alerts(token, checked)
    assert set(alerts) == {0, 2}
    for rank, peer in ((0, 2), (2, 0)):
        assert alerts[rank].evidence["ambiguous"] and alerts[rank].evidence["peers"] == [peer]
        assert alerts[rank].evidence["shard"] == keys[0]
