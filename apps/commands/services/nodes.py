"""Node cordon, uncordon and drain state, and the cluster's scheduler hooks."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.audit.services import audit_record
from apps.clusters.choices import NodeState
from apps.clusters.models import Node
from apps.commands.choices import NODE_NAME_PATTERN
from apps.commands.models import ClusterHooks, MaintenanceVisit

OUTPUT_KEPT = 4000  # characters of a hook's stdout / stderr kept in the audit entry
# After a timeout's SIGKILL, how long to wait for the hook's pipes to close
OUTPUT_WAIT_S = 5.0
_NODE_NAME = re.compile(NODE_NAME_PATTERN)


class HookFailed(Exception):
    """The scheduler hook exited non-zero, timed out or could not start."""

    def __init__(self, result: HookResult) -> None:
        super().__init__(result.error or f"hook exited with {result.exit_code}")
        self.result = result


@dataclass(frozen=True)
class HookResult:
    argv: list[str]
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.error

    def to_dict(self) -> dict[str, Any]:
        return {
            "argv": self.argv,
            "exit_code": self.exit_code,
            "stdout": self.stdout[-OUTPUT_KEPT:],
            "stderr": self.stderr[-OUTPUT_KEPT:],
            "error": self.error,
        }


def hook_argv(template: list[str], *, node: str, reason: str) -> list[str]:
    """The template with {node} and {reason} filled in, item by item (plain replacement, not
    str.format: a template cannot reach attributes). Raises ValueError for a node name that
    is not a plain host name (an option such as "-x" or a path never reaches the hook)."""
    if not _NODE_NAME.match(node):
        raise ValueError(f"node name {node!r} is not a plain host name")
    if any(ord(char) < 32 for char in reason):
        raise ValueError("reason has control characters")
    return [str(item).replace("{node}", node).replace("{reason}", reason) for item in template]


def hook_run(*, node: Node, which: str, reason: str) -> HookResult | None:
    """Run the cluster's `which` hook (cordon | uncordon | drain) for the node, without a
    shell and within its timeout. None when the cluster has no such hook."""
    hooks = ClusterHooks.objects.filter(cluster_id=node.cluster_id).first()
    template = getattr(hooks, f"{which}_argv", None) if hooks else None
    if not template:
        return None
    try:
        argv = hook_argv(template, node=node.name, reason=reason)
    except ValueError as error:
        return HookResult(argv=[], exit_code=None, error=str(error))
    return argv_run(argv=argv, timeout_s=hooks.timeout_s)


def argv_run(*, argv: list[str], timeout_s: float) -> HookResult:
    """Run argv without a shell, in a session of its own, within `timeout_s`: on timeout the
    whole process group is killed. Never raises for the command's failures (they are in the
    result: exit code, error)."""
    try:
        # a session of its own: on timeout the whole process group goes, not the hook's
        # first process alone (a wrapper script's `scontrol` or `kubectl` would live on)
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            shell=False,
            start_new_session=True,
        )
    except OSError as error:
        return HookResult(argv=argv, exit_code=None, error=f"could not start: {error}")
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        try:
            stdout, stderr = process.communicate(timeout=OUTPUT_WAIT_S)
        except subprocess.TimeoutExpired:  # a process that left the group holds the pipes
            for pipe in (process.stdout, process.stderr):
                pipe.close()  # type: ignore[union-attr]
            process.wait()
            stdout = stderr = ""
        return HookResult(
            argv=argv,
            exit_code=None,
            stdout=_text(stdout),
            stderr=_text(stderr),
            error=f"timed out after {timeout_s:g} s",
        )
    return HookResult(argv=argv, exit_code=process.returncode, stdout=stdout, stderr=stderr)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _text(output: bytes | str | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def node_cordon(
    *,
    node: Node,
    reason: str = "",
    actor_user=None,
    actor_kind: str = "user",
    actor_name: str = "",
    request=None,
    state: str = NodeState.CORDONED,
    hook: str = "cordon",
) -> HookResult | None:
    """Take the node out of run plans (state `cordoned`, `draining` for a drain, or
    `maintenance`: cordoned for repair, through the cordon hook, its stay recorded as a
    MaintenanceVisit), after the scheduler hook agreed. A failing hook raises HookFailed and
    changes nothing."""
    maintenance = state == NodeState.MAINTENANCE
    # the scheduler's drain reason says it is maintenance, not a plain cordon
    told = f"maintenance: {reason}" if maintenance else reason
    result = hook_run(node=node, which=hook, reason=told)
    ok = result is None or result.ok
    action = "node.maintenance" if maintenance else f"node.{hook}"
    with transaction.atomic():
        if ok:
            now = timezone.now()
            Node.objects.filter(pk=node.pk).update(
                state=state,
                cordon_reason=reason,
                cordoned_at=now,
                cordoned_by_id=getattr(actor_user, "pk", None),
            )
            if maintenance:
                _visit_open(node, reason, actor_user, now)
        _audit(action, ok, node, reason, result, actor_user, actor_kind, actor_name, request)
    if not ok:
        raise HookFailed(result)
    return result


def node_uncordon(
    *,
    node: Node,
    reason: str = "",
    actor_user=None,
    actor_kind: str = "user",
    actor_name: str = "",
    request=None,
) -> HookResult | None:
    """Return the node to run plans (state `active`) after the uncordon hook agreed; a node
    in maintenance is returned to service, its stay closed with `reason` as the note."""
    result = hook_run(node=node, which="uncordon", reason=reason)
    ok = result is None or result.ok
    with transaction.atomic():
        if ok:
            Node.objects.filter(pk=node.pk).update(
                state=NodeState.ACTIVE, cordon_reason="", cordoned_at=None, cordoned_by_id=None
            )
            MaintenanceVisit.objects.filter(node=node, returned_at__isnull=True).update(
                returned_at=timezone.now(),
                return_note=reason,
                returned_by_id=getattr(actor_user, "pk", None),
            )
        _audit(
            "node.uncordon", ok, node, reason, result, actor_user, actor_kind, actor_name, request
        )
    if not ok:
        raise HookFailed(result)
    return result


def node_drain_settle(*, node_id: int) -> None:
    """A drain is over (however it ended): a draining node ends cordoned."""
    Node.objects.filter(pk=node_id, state=NodeState.DRAINING).update(state=NodeState.CORDONED)


def _visit_open(node: Node, reason: str, actor_user, now) -> None:
    """Open the node's stay in maintenance; one already open (sent again) stands, with the
    newer reason."""
    opened = MaintenanceVisit.objects.filter(node=node, returned_at__isnull=True)
    if not opened.update(reason=reason):
        MaintenanceVisit.objects.create(
            cluster_id=node.cluster_id,
            node=node,
            sent_at=now,
            reason=reason,
            sent_by_id=getattr(actor_user, "pk", None),
        )


def _audit(action, ok, node, reason, result, actor_user, actor_kind, actor_name, request):
    audit_record(
        action=action,
        outcome="succeeded" if ok else "failed",
        actor_user=actor_user,
        actor_kind=actor_kind,
        actor_name=actor_name,
        cluster=node.cluster,
        target=f"node:{node.name}",
        reason=reason,
        detail={"hook": result.to_dict()} if result else {"hook": None},
        request=request,
    )
