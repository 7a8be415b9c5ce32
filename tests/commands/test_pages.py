"""The run and node pages' command buttons and forms (Django test client): who sees them, what
a post issues, the typed confirmation, the hidden idempotency token, CSRF, 404 and 403."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime

import pytest
from django.test import Client

from apps.audit.models import AuditEntry
from apps.clusters.models import Cluster, Node
from apps.commands.models import Command
from apps.commands.rows import result_text
from apps.runs.models import Run, RunEvent, StepReport
from tests.access.conftest import client_of, user_with
from tests.commands.conftest import settled

pytestmark = pytest.mark.django_db

RUN_PAGE = "/clusters/alpha/runs/run-1/"
NODE_PAGE = "/clusters/alpha/nodes/node-00/"


@pytest.fixture
def alpha(db):
    """alpha: run-1 served by node-00 (so the plan names it) with a durable checkpoint at
    step 5; beta: a cluster of its own with the same names."""
    now = datetime.now(UTC)
    for name in ("alpha", "beta"):
        cluster = Cluster.objects.create(name=name)
        node = Node.objects.create(cluster=cluster, name="node-00")
        run = Run.objects.create(cluster=cluster, name="run-1", last_step=10, last_step_at=now)
        StepReport.objects.create(run=run, node=node, ts=now, rank=0, step=10, step_time=1.0)
    run = Run.objects.get(cluster__name="alpha")
    node = Node.objects.get(cluster=run.cluster)
    RunEvent.objects.create(
        cluster_id=run.cluster_id, run=run, node=node, ts=now, kind="checkpoint", step=5, rank=0,
        data={"tier": "durable", "state": "completed", "path": "/ckpt/step-5"},
    )  # fmt: skip
    return Cluster.objects.get(name="alpha")


@pytest.fixture
def operator(alpha):
    return client_of(user_with("olga", alpha="operator"))


@pytest.fixture
def viewer(alpha):
    return client_of(user_with("vik", alpha="viewer", beta="operator"))


def token_of(html: str, kind: str) -> str:
    found = re.search(rf'<form[^>]*id="form-{kind}".*?name="token" value="([^"]+)"', html, re.S)
    assert found, f"no {kind} form"
    return found.group(1)


def post(client: Client, url: str, **fields) -> object:
    fields.setdefault("token", str(uuid.uuid4()))
    return client.post(url, fields)


def test_an_operator_sees_the_buttons_and_a_viewer_only_the_list(operator, viewer):
    run_page = operator.get(RUN_PAGE).content.decode()
    for action in ("checkpoint", "stop", "resume"):
        assert f'data-action="{action}"' in run_page, action
    node_page = operator.get(NODE_PAGE).content.decode()
    assert 'data-action="cordon"' in node_page and 'data-action="drain"' in node_page
    assert 'data-action="uncordon"' not in node_page
    for url in (RUN_PAGE, NODE_PAGE):
        page = viewer.get(url).content.decode()
        assert 'id="commands-list"' in page
        assert "data-action=" not in page and 'id="command-actions"' not in page
        assert "/commands/" not in page  # no form posts anywhere


def test_each_rendered_form_carries_its_own_token(operator):
    first, second = (operator.get(RUN_PAGE).content.decode() for _ in range(2))
    tokens = {token_of(page, kind) for page in (first, second) for kind in ("checkpoint", "stop")}
    assert len(tokens) == 4


def test_the_resume_form_is_filled_from_the_run_plan(operator):
    page = operator.get(RUN_PAGE).content.decode()
    form = re.search(r'<form[^>]*id="form-resume".*?</form>', page, re.S).group(0)
    assert 'id="resume-checkpoint"' in form and 'value="/ckpt/step-5"' in form
    assert re.search(r'id="resume-step"[^>]*value="5"|value="5"[^>]*id="resume-step"', form)
    assert 'value="node-00"' in form


def test_a_foreign_cluster_is_not_found(operator):
    token = str(uuid.uuid4())
    assert operator.get("/clusters/beta/runs/run-1/").status_code == 404
    assert operator.get("/clusters/beta/nodes/node-00/").status_code == 404
    for url in (
        "/clusters/beta/runs/run-1/commands/checkpoint",
        "/clusters/beta/nodes/node-00/commands/cordon",
        "/clusters/beta/runs/run-1/commands.json",
        "/clusters/beta/nodes/node-00/commands.json",
        "/clusters/alpha/runs/nope/commands/checkpoint",
        "/clusters/alpha/runs/run-1/commands/cordon",  # a node kind on a run
        "/clusters/alpha/nodes/node-00/commands/stop",
    ):
        assert operator.get(url).status_code == 404, url
        if not url.endswith(".json"):
            assert operator.post(url, {"token": token}).status_code == 404, url
    assert Command.objects.count() == 0


def test_checkpoint_now_issues_a_command_and_says_so(operator):
    token = token_of(operator.get(RUN_PAGE).content.decode(), "checkpoint")
    response = operator.post(f"{RUN_PAGE}commands/checkpoint", {"token": token})
    assert response.status_code == 302
    assert response["Location"] == f"{RUN_PAGE}#commands"
    command = Command.objects.get()
    assert (command.kind, command.run.name, command.issued_by.username) == (
        "checkpoint", "run-1", "olga"
    )  # fmt: skip
    assert command.idempotency_key == token
    page = operator.get(RUN_PAGE).content.decode()
    assert f"Checkpoint now run-1: command {command.pk} is issued." in page
    row = re.search(rf'<tr data-command-id="{command.pk}"[^>]*data-state="issued"', page)
    assert row, "the new command is listed"
    listed = operator.get(f"{RUN_PAGE}commands.json").json()
    assert [(r["id"], r["state"], r["issued_by"], r["run_state"]) for r in listed["commands"]] == [
        (str(command.pk), "issued", "olga", "running")
    ]
    # the run's header, which the page redraws from it after a stop or resume
    assert listed["run"] == {
        "state": "running", "ended_at": None, "ended_at_text": "", "end_message": ""
    }  # fmt: skip


def test_the_same_form_sent_twice_makes_one_command(operator):
    token = token_of(operator.get(RUN_PAGE).content.decode(), "checkpoint")
    for _ in range(2):
        assert operator.post(f"{RUN_PAGE}commands/checkpoint", {"token": token}).status_code == 302
    assert Command.objects.count() == 1
    assert "Already issued by this form" in operator.get(RUN_PAGE).content.decode()
    assert operator.post(f"{RUN_PAGE}commands/checkpoint", {}).status_code == 400  # no token
    assert Command.objects.count() == 1


def test_stop_wants_a_reason_and_the_run_name_typed_exactly(operator):
    url = f"{RUN_PAGE}commands/stop"
    for wrong in ("run-2", "run-1 ", "RUN-1", ""):
        response = post(operator, url, reason="bad GPU", confirm=wrong)
        assert response.status_code == 400, wrong
        assert 'id="form-stop"' in response.content.decode()
    mismatch = post(operator, url, reason="bad GPU", confirm="run-2").content.decode()
    assert "The name typed does not match: type run-1 exactly to confirm." in mismatch
    assert 'value="bad GPU"' in mismatch  # what was typed stays
    no_reason = post(operator, url, reason="", confirm="run-1")
    assert no_reason.status_code == 400
    assert Command.objects.count() == 0

    assert post(operator, url, reason="bad GPU", confirm="run-1").status_code == 302
    stop = Command.objects.get()
    assert (stop.kind, stop.reason, stop.state) == ("stop", "bad GPU", "issued")


def test_drain_wants_the_node_name_and_cordons_then_shows_uncordon(
    live_stack, transactional_db, operator
):
    url = f"{NODE_PAGE}commands/drain"
    assert post(operator, url, reason="XID 79", confirm="node-01").status_code == 400
    assert post(operator, url, reason="XID 79", confirm="node-00").status_code == 302
    drain = Command.objects.get(kind="drain")
    assert drain.node.name == "node-00" and drain.reason == "XID 79"
    # the drain hook runs in the worker; the post answered before it did
    settled(drain.cluster)
    assert Node.objects.get(cluster__name="alpha").state == "draining"
    # a cordon while it drains is refused, the form shown again saying why
    refused = post(operator, f"{NODE_PAGE}commands/cordon", reason="mine")
    assert refused.status_code == 409 and "is draining" in refused.content.decode()
    assert not Command.objects.filter(kind="cordon").exists()
    page = operator.get(NODE_PAGE).content.decode()
    assert 'data-action="drain"' not in page and 'data-action="cordon"' not in page
    assert f'data-command-id="{drain.pk}"' in page


def test_cordon_and_uncordon_swap_buttons(live_stack, transactional_db, operator):
    assert post(operator, f"{NODE_PAGE}commands/cordon", reason="flaky").status_code == 302
    settled(Cluster.objects.get(name="alpha"))
    node = Node.objects.get(cluster__name="alpha")
    assert (node.state, node.cordon_reason) == ("cordoned", "flaky")
    page = operator.get(NODE_PAGE).content.decode()
    assert 'data-action="uncordon"' in page and 'data-action="cordon"' not in page
    assert 'data-action="drain"' in page
    row = re.search(r'<tr data-command-id="[^"]+" data-kind="cordon" data-state="succeeded"', page)
    assert row and "hook: none" in page
    assert post(operator, f"{NODE_PAGE}commands/uncordon").status_code == 302
    settled(Cluster.objects.get(name="alpha"))
    assert Node.objects.get(cluster__name="alpha").state == "active"


def test_resume_takes_the_edited_plan_and_refuses_a_bad_node_name(operator):
    url = f"{RUN_PAGE}commands/resume"
    bad = post(operator, url, checkpoint="/ckpt/step-5", step="5", nodes="node-00, a/b")
    assert bad.status_code == 400 and Command.objects.count() == 0
    assert 'id="form-resume"' in bad.content.decode()
    fields = {"checkpoint": "/ckpt/other", "step": "4", "nodes": "node-00 node-07"}
    assert post(operator, url, reason="after maintenance", **fields).status_code == 302
    resume = Command.objects.get()
    assert resume.args == {"checkpoint": "/ckpt/other", "step": 4, "nodes": ["node-00", "node-07"]}


def test_the_form_page_alone_shows_the_form_to_an_operator_only(operator, viewer):
    page = operator.get(f"{RUN_PAGE}commands/stop")
    assert page.status_code == 200 and 'data-action="stop-submit"' in page.content.decode()
    assert viewer.get(f"{RUN_PAGE}commands/stop").status_code == 403


def test_a_post_without_the_csrf_token_is_refused(alpha):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user_with("olga", alpha="operator"))
    response = client.post(f"{RUN_PAGE}commands/checkpoint", {"token": str(uuid.uuid4())})
    assert response.status_code == 403
    assert Command.objects.count() == 0
    # the same client with the page's token gets through (the refusal was the missing token)
    page = client.get(RUN_PAGE).content.decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    response = client.post(
        f"{RUN_PAGE}commands/checkpoint",
        {"token": token_of(page, "checkpoint"), "csrfmiddlewaretoken": csrf},
    )
    assert response.status_code == 302 and Command.objects.count() == 1


def test_a_viewer_posting_is_refused_and_audited(alpha, viewer):
    for url, fields in (
        (f"{RUN_PAGE}commands/checkpoint", {}),
        (f"{RUN_PAGE}commands/stop", {"reason": "x", "confirm": "run-1"}),
        (f"{NODE_PAGE}commands/drain", {"reason": "x", "confirm": "wrong name"}),
    ):
        assert post(viewer, url, **fields).status_code == 403, url
    assert Command.objects.count() == 0
    denied = AuditEntry.objects.filter(outcome="denied", actor_name="vik", cluster_id=alpha.pk)
    assert sorted(denied.values_list("action", "target")) == [
        ("command.checkpoint", "run:run-1"),
        ("command.drain", "node:node-00"),
        ("command.stop", "run:run-1"),
    ]
    assert Node.objects.get(cluster__name="alpha").state == "active"


def test_a_result_reads_as_one_line():
    hook = {"argv": ["kubectl"], "exit_code": 0, "stdout": "", "stderr": "", "error": ""}
    assert result_text({"hook": hook, "runs": ["a", "b"]}) == "hook: exit 0; runs: a, b"
    assert result_text({"hook": {**hook, "exit_code": None, "error": "timed out"}}) == (
        "hook: failed (timed out)"
    )
    assert result_text({}) == ""
    assert len(result_text({"message": "x" * 1000})) == 300


def test_a_cordon_on_its_way_offers_the_uncordon_and_no_second_cordon(operator):
    # no worker here: the cordon stays issued, its hook not run, the node still active
    assert post(operator, f"{NODE_PAGE}commands/cordon", reason="flaky").status_code == 302
    assert Command.objects.get(kind="cordon").state == "issued"
    assert Node.objects.get(cluster__name="alpha").state == "active"
    page = operator.get(NODE_PAGE).content.decode()
    assert 'data-action="uncordon"' in page and 'data-action="cordon"' not in page
    assert re.search(r'<tr data-command-id="[^"]+" data-kind="cordon" data-state="issued"', page)


def test_maintenance_wants_a_reason_and_return_wants_a_note(live_stack, transactional_db, operator):
    page = operator.get(NODE_PAGE).content.decode()
    assert 'data-action="maintenance-submit"' in page and 'data-action="return"' not in page
    url = f"{NODE_PAGE}commands/maintenance"
    assert post(operator, url, reason="").status_code == 400
    assert post(operator, url, reason="fans failing on GPU 2").status_code == 302
    settled(Cluster.objects.get(name="alpha"))
    node = Node.objects.get(cluster__name="alpha")
    assert (node.state, node.cordon_reason) == ("maintenance", "fans failing on GPU 2")
    page = operator.get(NODE_PAGE).content.decode()
    assert 'data-action="return"' in page
    for action in ("cordon", "uncordon", "drain", "maintenance-submit"):
        assert f'data-action="{action}"' not in page
    overview = operator.get("/clusters/alpha/").content.decode()
    assert '<span id="count-maintenance">1</span>' in overview
    # returning it without a note of what was done is refused, by the form and the service
    refused = post(operator, f"{NODE_PAGE}commands/uncordon", reason=" ")
    assert refused.status_code == 400 and "takes a note" in refused.content.decode()
    assert not Command.objects.filter(kind="uncordon").exists()
    done = post(operator, f"{NODE_PAGE}commands/uncordon", reason="fans replaced")
    assert done.status_code == 302
    settled(Cluster.objects.get(name="alpha"))
    assert Node.objects.get(cluster__name="alpha").state == "active"
