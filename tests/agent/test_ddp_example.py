"""examples/ddp_train.py under torchrun (4 CPU ranks, gloo) against the real stack: the
step reports of every rank are stored and the corruption checks agree — or, with a fault
injected, single out the faulty rank."""

from __future__ import annotations

import math
import sys
from collections import defaultdict

import pytest

from launcher.procs import wait_until
from tests.agent.conftest import REPO
from tests.agent.torchrun import run_ok

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]

STEPS, CHECK_EVERY, RANKS = 30, 5, 4


def train(url: str, secret: str, tmp_path, run: str, *fault: str) -> None:
    token_file = tmp_path / f"{run}.token"
    token_file.write_text(secret)
    # "--" ends torchrun's own options: its parser would take `--run` for `--run-path`.
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(RANKS),
        str(REPO / "examples" / "ddp_train.py"),
        "--",
        "--server",
        url,
        "--token-file",
        str(token_file),
        "--run",
        run,
        "--steps",
        str(STEPS),
        "--check-every",
        str(CHECK_EVERY),
        "--spool-dir",
        str(tmp_path / run),
        *fault,
    ]
    run_ok(command)


def reports(token, run: str):
    from apps.runs.models import StepReport

    return list(StepReport.objects.filter(run__cluster=token.cluster, run__name=run))


def wait_for_reports(token, run: str):
    wait_until(
        lambda: len(reports(token, run)) == STEPS * RANKS,
        90,
        f"{STEPS * RANKS} step reports of {run}",
    )
    return reports(token, run)


def by_step(rows):
    checked = defaultdict(dict)
    for row in rows:
        if row.step % CHECK_EVERY == 0:
            checked[row.step][row.rank] = row
    return checked


def canary_close(a, b, rel=1e-4) -> bool:
    return math.isclose(a.canary_norm, b.canary_norm, rel_tol=rel) and all(
        math.isclose(x, y, rel_tol=rel, abs_tol=1e-9)
        for x, y in zip(a.canary_proj, b.canary_proj, strict=True)
    )


def test_a_healthy_run_reports_every_rank_and_agrees(live_stack, agent_token, tmp_path):
    token, secret = agent_token
    train(live_stack.url, secret, tmp_path, "ddp-healthy")
    rows = wait_for_reports(token, "ddp-healthy")
    assert {row.rank for row in rows} == set(range(RANKS))
    checked = by_step(rows)
    assert sorted(checked) == list(range(0, STEPS, CHECK_EVERY))
    for ranks in checked.values():
        assert sorted(ranks) == list(range(RANKS))
        reference = ranks[0]
        assert reference.grad_checksum and reference.param_checksum
        for row in ranks.values():
            assert row.grad_checksum == reference.grad_checksum
            assert row.param_checksum == reference.param_checksum
            assert len(row.canary_proj) == 4 and canary_close(row, reference)


def test_a_rank_with_wrong_gradients_shows_in_its_canary_only(live_stack, agent_token, tmp_path):
    token, secret = agent_token
    train(live_stack.url, secret, tmp_path, "ddp-perturbed", "--perturb-grad-rank", "2")
    for ranks in by_step(wait_for_reports(token, "ddp-perturbed")).values():
        healthy = ranks[0]
        assert not canary_close(ranks[2], healthy)
        for rank in (1, 3):
            assert canary_close(ranks[rank], healthy)
        # all-reduce spreads the error: the checksums still agree everywhere
        assert {row.grad_checksum for row in ranks.values()} == {healthy.grad_checksum}
        assert {row.param_checksum for row in ranks.values()} == {healthy.param_checksum}
