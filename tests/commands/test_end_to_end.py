"""Operators act on a real training job, end to end: examples/ddp_train.py under torchrun
(4 gloo CPU ranks on two "nodes": ranks 0-1 report from node-01, 2-3 from node-02) wrapped in
`opsboard-agent supervise` on node-01, against a live stack whose processes find a
`scontrol` stand-in on PATH. In Chromium an operator of the cluster

1. clicks *Checkpoint now* on the run page: every rank saves at one step, local then
   durable, and the command's row turns `succeeded`;
2. drains node-01 on its node page (name typed again, a reason): the drain hook runs, the
   job is checkpointed and stopped, the node ends cordoned;
3. resumes the run from its page, the form filled from the plan: supervise starts the job
   again from that checkpoint on the plan's nodes (node-02 only), a `restart` event is
   reported and every rank's step counter goes on at the checkpoint's step + 1."""

from __future__ import annotations

import re
import uuid
from collections import defaultdict

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from apps.access.services import role_grant
from apps.audit.models import AuditEntry
from apps.clusters.models import Node
from apps.clusters.services import token_issue
from apps.commands.models import ClusterHooks, Command
from apps.runs.models import Run, RunEvent, StepReport
from tests.browser import screenshot
from tests.commands.e2e import SupervisedJob, calls, scontrol_standin, start_hooked_stack, wait_for
from tests.conftest import stack_env
from tests.dashboard.conftest import PASSWORD, BrowserPage, chromium  # noqa: F401

pytestmark = [pytest.mark.stack, pytest.mark.timeout(420)]

RUN, NODE, OTHER = "e2e-run", "node-01", "node-02"
RANKS = range(4)
DRAIN_REASON = "e2e: XID 79 on GPU 3; see ticket 7"
LIVE = "#live-status[data-state=live]"


@pytest.fixture(scope="module")
def hooked_stack(django_db_setup, django_db_blocker, tmp_path_factory):
    """(stack, file of scontrol calls): its own Redis prefix, so that its workers and
    long-polls are apart from the session's stack."""
    root = tmp_path_factory.mktemp("e2e-hooks")
    record = root / "scontrol-calls.jsonl"
    scontrol_standin(root / "bin", record)
    env = stack_env(OPSBOARD_REDIS_PREFIX=f"{settings.REDIS_PREFIX}-e2e")
    with django_db_blocker.unblock():
        stack = start_hooked_stack(env, root / "bin")
    yield stack, record
    stack.stop()


@pytest.fixture
def cluster_setup(live_db):
    """(cluster, agent secret, operator): the operator holds the operator role on it; its
    drain hook is Slurm's."""
    token, secret = token_issue(cluster_name=f"e2e-{uuid.uuid4().hex[:8]}", name="agent")
    operator = get_user_model().objects.create_user("olga-e2e", password=PASSWORD)
    role_grant(user=operator, cluster=token.cluster, role="operator")
    ClusterHooks.objects.create(
        cluster=token.cluster,
        drain_argv=["scontrol", "update", "NodeName={node}", "State=DRAIN", "Reason={reason}"],
        timeout_s=20,
    )
    return token.cluster, secret, operator


@pytest.fixture
def job(hooked_stack, cluster_setup, tmp_path):
    stack, _ = hooked_stack
    _, secret, _ = cluster_setup
    supervised = SupervisedJob(
        server=stack.url, secret=secret, run=RUN, node=NODE, workdir=tmp_path,
        nodes=f"{NODE},{OTHER}",
    ).start()  # fmt: skip
    try:
        yield supervised
    finally:
        supervised.stop()


def row(command_id, state: str) -> str:
    return f'#commands-list tr[data-command-id="{command_id}"][data-state="{state}"]'


class Story:
    """What the test reads while it waits, and the state it reports when a wait times out."""

    def __init__(self, cluster, job: SupervisedJob) -> None:
        self.cluster, self.job = cluster, job

    def run(self) -> Run | None:
        return Run.objects.filter(cluster=self.cluster, name=RUN).first()

    def reports(self, **filters) -> list[StepReport]:
        return list(
            StepReport.objects.filter(run__cluster=self.cluster, run__name=RUN, **filters)
            .select_related("node")
            .order_by("step")
        )

    def checkpoints(self, step: int | None = None) -> list[RunEvent]:
        events = RunEvent.objects.filter(run__cluster=self.cluster, run__name=RUN)
        events = events.filter(kind="checkpoint").order_by("ts", "pk")  # ties: batch order
        return list(events if step is None else events.filter(step=step))

    def state(self) -> str:
        self.job.remember_processes()
        commands = Command.objects.filter(cluster=self.cluster).order_by("issued_at")
        lines = [f"{c.kind} {c.pk}: {c.state} {c.result}" for c in commands]
        run = self.run()
        seen = defaultdict(set)
        for report in self.reports():
            seen[report.node.name].add(report.rank)
        return (
            f"run: {run and (run.state, run.last_step)}; ranks by node: {dict(seen)}; "
            f"commands: {lines}; launches: {self.job.launches()}; "
            f"supervisor exit: {self.job.popen.poll()}; job log tail:\n{self.job.log_tail()}"
        )

    def wait(self, predicate, timeout: float, what: str):
        return wait_for(predicate, timeout, what, self.state)

    def wait_row(self, page, command: Command, state: str, timeout: float) -> None:
        """The command's row in `page`'s list reaches `state`, live (no reload)."""
        selector = row(command.pk, state)
        try:
            page.wait_for_selector(selector, timeout=timeout * 1000)
        except Exception as error:  # Playwright's TimeoutError: say where things stood
            rows = page.locator("#commands-list tr[data-command-id]")
            shown = [
                (rows.nth(i).get_attribute("data-kind"), rows.nth(i).get_attribute("data-state"))
                for i in range(rows.count())
            ]
            raise AssertionError(
                f"{command.kind} {command.pk} never showed {state!r} in the page "
                f"(rows: {shown}); {self.state()}"
            ) from error


def click_checkpoint_now(story: Story, page, run_url: str) -> tuple[Command, int]:
    """Checkpoint now → every rank saves at one step, local before durable; the row turns
    succeeded. Returns the command and its step."""
    page.goto(run_url)
    page.wait_for_selector(LIVE, timeout=20_000)
    page.click('[data-action="checkpoint"]')
    page.wait_for_url(re.compile(r".*/runs/e2e-run/#commands$"))
    command = Command.objects.get(cluster=story.cluster, kind="checkpoint", parent=None)
    story.wait_row(page, command, "succeeded", timeout=90)
    command.refresh_from_db()
    step = command.result["step"]
    both_tiers = {(rank, tier) for rank in RANKS for tier in ("local", "durable")}

    def completed() -> set:
        events = story.checkpoints(step)
        return {(e.rank, e.data["tier"]) for e in events if e.data["state"] == "completed"}

    story.wait(lambda: completed() == both_tiers, 30, f"every rank's checkpoint of step {step}")
    events = story.checkpoints()
    assert {e.step for e in events} == {step}, "the ranks saved at different steps"
    for rank in RANKS:
        order = [(e.data["tier"], e.data["state"]) for e in events if e.rank == rank]
        assert order == [
            ("local", "started"), ("local", "completed"),
            ("durable", "started"), ("durable", "completed"),
        ], f"rank {rank}: {order}"  # fmt: skip
    durable = story.job.checkpoint_dir / RUN / "durable" / f"step-{step}"
    assert sorted(p.name for p in durable.iterdir()) == [f"rank-{r}.pt" for r in RANKS]
    return command, step


def drain_node(story: Story, page, node_url: str, record, first_step: int) -> int:
    """Drain node-01 → the hook ran, a checkpoint then a stop of the run, the job stopped,
    the node cordoned. Returns the drain checkpoint's step."""
    page.goto(node_url)
    page.wait_for_selector(LIVE, timeout=20_000)
    story.job.remember_processes()
    page.click('[data-action="drain"]')
    page.fill("#drain-reason", DRAIN_REASON)
    page.fill("#drain-confirm", NODE)
    page.click('[data-action="drain-submit"]')
    page.wait_for_url(re.compile(r".*/nodes/node-01/#commands$"))
    drain = Command.objects.get(cluster=story.cluster, kind="drain")
    story.wait_row(page, drain, "succeeded", timeout=150)

    assert calls(record) == [
        ["update", "NodeName=node-01", "State=DRAIN", f"Reason={DRAIN_REASON}"]
    ]
    hook = AuditEntry.objects.get(cluster_id=story.cluster.pk, action="node.drain")
    assert hook.outcome == "succeeded" and hook.detail["hook"]["exit_code"] == 0
    node = Node.objects.get(cluster=story.cluster, name=NODE)
    assert (node.state, node.cordon_reason) == ("cordoned", DRAIN_REASON)
    children = {c.kind: c for c in drain.children.all()}
    assert sorted(children) == ["checkpoint", "stop"]
    assert {c.state for c in children.values()} == {"succeeded"}
    assert children["stop"].node_id == node.pk and children["stop"].run.name == RUN
    step = children["checkpoint"].result["step"]
    assert step > first_step
    story.wait(
        lambda: {e.rank for e in story.checkpoints(step) if e.data["tier"] == "durable"
                 and e.data["state"] == "completed"} == set(RANKS),
        30, f"every rank's durable checkpoint of step {step}",
    )  # fmt: skip
    (first,) = story.job.launches()
    gone = [pid for pid in (first["pid"], *first["agents"]) if story.job.alive(pid)]
    assert not gone, f"the job outlived its stop: {gone}"
    assert story.run().state == "stopped"
    assert story.job.popen.poll() is None, "supervise must stay, waiting for a resume"
    return step


def resume_run(story: Story, page, run_url: str, step: int) -> None:
    """Resume, the form filled from the plan → supervise starts the job from that checkpoint
    on node-02 alone; a restart event; each rank goes on at step + 1."""
    checkpoint = str(story.job.checkpoint_dir / RUN / "durable" / f"step-{step}")
    page.goto(run_url)
    page.wait_for_selector(LIVE, timeout=20_000)
    page.click('[data-action="resume"]')
    assert page.input_value("#resume-checkpoint") == checkpoint
    assert page.input_value("#resume-nodes") == OTHER  # node-01 is cordoned
    screenshot(page, "commands-e2e-resume")
    page.click('[data-action="resume-submit"]')
    page.wait_for_url(re.compile(r".*/runs/e2e-run/#commands$"))
    resume = Command.objects.get(cluster=story.cluster, kind="resume")
    story.wait_row(page, resume, "succeeded", timeout=60)
    assert resume.args["checkpoint"] == checkpoint and resume.args["nodes"] == [OTHER]

    launches = story.job.launches()
    assert len(launches) == 2, launches
    assert (launches[1]["nodes"], launches[1]["resume_from"]) == ([OTHER], checkpoint)
    restart = story.wait(
        lambda: RunEvent.objects.filter(run__cluster=story.cluster, kind="restart").first(),
        30, "the restart event",
    )  # fmt: skip
    assert restart.data["checkpoint"] == checkpoint and restart.node.name == NODE

    def resumed() -> dict[int, list[int]]:
        after = story.reports(node__name=OTHER, ts__gte=restart.ts)
        steps = defaultdict(list)
        for report in after:
            steps[report.rank].append(report.step)
        return steps if set(steps) == set(RANKS) and min(map(len, steps.values())) >= 3 else {}

    steps = story.wait(resumed, 90, "three steps of every rank on node-02 after the resume")
    for rank, seen in steps.items():
        assert seen[:3] == [step + 1, step + 2, step + 3], f"rank {rank} resumed at {seen[:3]}"
    assert not story.reports(node__name=NODE, ts__gte=restart.ts)
    assert story.run().state == "running"


@pytest.mark.django_db(transaction=True)
def test_an_operator_checkpoints_drains_and_resumes_a_real_ddp_job(
    chromium,  # noqa: F811
    hooked_stack,
    cluster_setup,
    job,
):
    stack, record = hooked_stack
    cluster, _, operator = cluster_setup
    story = Story(cluster, job)
    browser = BrowserPage(chromium, stack.url, operator.username)
    try:
        story.wait(
            lambda: {(r.node.name, r.rank) for r in story.reports()}
            >= {(NODE, 0), (NODE, 1), (OTHER, 2), (OTHER, 3)},
            120, "step reports of ranks 0-1 from node-01 and 2-3 from node-02",
        )  # fmt: skip
        base = f"{stack.url}/clusters/{cluster.name}"
        run_url, node_url = f"{base}/runs/{RUN}/", f"{base}/nodes/{NODE}/"
        _, first_step = click_checkpoint_now(story, browser.page, run_url)
        drained_step = drain_node(story, browser.page, node_url, record, first_step)
        resume_run(story, browser.page, run_url, drained_step)
        screenshot(browser.page, "commands-e2e-run")
        assert browser.errors == []
    finally:
        browser.close()
