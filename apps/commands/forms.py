"""The pages' command forms: a hidden idempotency token per rendered form, a reason, the
run's or node's name typed again for the kinds that take work away (stop, drain), and
resume's checkpoint and nodes (validated by the API's own CommandArgs)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pydantic
from django import forms

from apps.commands.choices import CONFIRMED_KINDS, REASON_MAX_LENGTH, CommandKind
from apps.core import bounds

# Kinds that stop work: the reason is required and the target's name is typed again.
NODES_SEPARATOR = re.compile(r"[\s,]+")
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f]")


class CommandForm(forms.Form):
    """One command of `kind` on the run or node named `target_name`. Field ids are
    "<kind>-<field>" (stop-reason, stop-confirm, resume-nodes, ...)."""

    token = forms.UUIDField(widget=forms.HiddenInput)
    reason = forms.CharField(max_length=REASON_MAX_LENGTH, required=False)

    def __init__(self, *args: Any, kind: str, target_name: str, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", f"{kind}-%s")
        kwargs.setdefault("initial", {})
        kwargs["initial"].setdefault("token", uuid.uuid4())
        super().__init__(*args, **kwargs)
        self.kind, self.target_name = kind, target_name
        # why a node goes to maintenance is on the record (the service refuses none too)
        self.fields["reason"].required = kind in CONFIRMED_KINDS or kind == CommandKind.MAINTENANCE
        if kind in CONFIRMED_KINDS:
            # exact: no stripping, so "run-1 " is not "run-1"
            self.fields["confirm"] = forms.CharField(
                strip=False,
                max_length=bounds.NAME_MAX_LENGTH,
                label=f"Type {target_name} to confirm",
            )
        if kind == CommandKind.RESUME:
            self.fields["checkpoint"] = forms.CharField(
                required=False, max_length=bounds.PATH_MAX_LENGTH, label="Checkpoint path"
            )
            self.fields["step"] = forms.IntegerField(
                required=False, min_value=0, max_value=bounds.STEP_MAX, label="Step"
            )
            self.fields["nodes"] = forms.CharField(
                required=False, label="Nodes (comma or space separated)"
            )

    def clean_reason(self) -> str:
        reason = self.cleaned_data["reason"]
        if CONTROL_CHARACTERS.search(reason):
            raise forms.ValidationError("The reason cannot hold control characters.")
        return reason

    def clean_confirm(self) -> str:
        typed = self.cleaned_data["confirm"]
        if typed != self.target_name:
            raise forms.ValidationError(
                f"The name typed does not match: type {self.target_name} exactly to confirm."
            )
        return typed

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.kind == CommandKind.RESUME and not self.errors:
            self._args = self._resume_args(cleaned)
        return cleaned

    def _resume_args(self, cleaned: dict[str, Any]) -> dict[str, Any]:
        # the API's own validation of args (imported here: it pulls in django-ninja)
        from apps.commands.schemas import CommandArgs

        raw: dict[str, Any] = {
            "checkpoint": cleaned.get("checkpoint") or None,
            "step": cleaned.get("step"),
        }
        nodes = [name for name in NODES_SEPARATOR.split(cleaned.get("nodes") or "") if name]
        if nodes:
            raw["nodes"] = nodes
        try:
            return CommandArgs(**raw).model_dump(exclude_none=True)
        except pydantic.ValidationError as error:
            for problem in error.errors():
                field = str(problem["loc"][0]) if problem["loc"] else None
                self.add_error(field if field in self.fields else None, problem["msg"])
            return {}

    @property
    def command_args(self) -> dict[str, Any]:
        """The command's args (resume: what the operator left out comes from the plan)."""
        return getattr(self, "_args", {})

    @property
    def idempotency_key(self) -> str:
        return str(self.cleaned_data["token"])


def resume_initial(plan: dict[str, Any]) -> dict[str, Any]:
    """The resume form pre-filled from the run plan (apps.commands.plan.run_plan)."""
    checkpoint = plan.get("checkpoint") or {}
    return {
        "checkpoint": checkpoint.get("path") or "",
        "step": checkpoint.get("step"),
        "nodes": ", ".join(plan.get("nodes") or []),
    }
