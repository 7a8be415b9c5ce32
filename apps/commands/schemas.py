"""The commands API's request and response shapes (apps.commands.api; the long-poll server
and the pages' forms validate with the same ones)."""

from __future__ import annotations

from typing import Any, Literal

from ninja import Field, Schema
from pydantic import ConfigDict, field_validator

from apps.commands.choices import REASON_MAX_LENGTH, CommandKind
from apps.core import bounds
from apps.core.params import CLUSTER_MAX_LENGTH

NAME_MAX_LENGTH = 255  # clusters_node.name, runs_run.name
WAIT_MAX_S = 30
KINDS_MAX_LENGTH = 200
Kind = Literal["checkpoint", "stop", "resume", "drain", "cordon", "uncordon", "maintenance"]
State = Literal["issued", "delivered", "accepted", "succeeded", "failed", "expired"]


class TransitionOut(Schema):
    from_state: State | None
    to_state: State
    at: float
    detail: dict[str, Any]


class CommandOut(Schema):
    id: str
    kind: Kind
    cluster: str
    run: str | None
    node: str | None
    args: dict[str, Any]
    reason: str
    state: State
    issued_by: str | None
    issued_at: float
    expires_at: float
    delivered_at: float | None
    accepted_at: float | None
    finished_at: float | None
    result: dict[str, Any]
    parent: str | None
    history: list[TransitionOut]


class CommandsOut(Schema):
    commands: list[CommandOut]


# Names looked up, not stored: a NUL would still reach Postgres in the WHERE clause, which
# refuses it (query strings are screened by apps.core.middleware; JSON bodies are not).
LookupName = bounds.text(NAME_MAX_LENGTH)
ClusterName = bounds.text(CLUSTER_MAX_LENGTH)
CheckpointPath = bounds.text(bounds.PATH_MAX_LENGTH, min_length=1)
StepNumber = bounds.integer(0, bounds.STEP_MAX)
RankNumber = bounds.integer(0, bounds.RANK_MAX)


class CommandArgs(Schema):
    """What an operator may pass: resume's checkpoint (path and step) and nodes, and the
    ranks a checkpoint expects. Bounded like ingest's fields: stored in jsonb, shown in
    pages, handed to agents."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: CheckpointPath | None = None
    step: StepNumber | None = None
    nodes: list[bounds.Name] | None = Field(default=None, max_length=4096)
    ranks: list[RankNumber] | None = Field(default=None, max_length=65536)


class CommandIn(Schema):
    kind: Kind
    run: LookupName | None = None
    node: LookupName | None = None
    args: CommandArgs = Field(default_factory=CommandArgs)
    reason: str = Field(default="", max_length=REASON_MAX_LENGTH, pattern=r"^[^\x00-\x1f]*$")
    cluster: ClusterName | None = Field(default=None, description="needed when names repeat")


class CommandsQuery(Schema):
    node: str | None = Field(default=None, max_length=NAME_MAX_LENGTH)
    run: str | None = Field(
        default=None,
        max_length=NAME_MAX_LENGTH,
        description="users: this run's commands; agents: only this run's commands are handed "
        "to this poll, others stay for the poller of their run (two runs on one node)",
    )
    state: State | None = None
    wait: float = Field(
        default=0, ge=0, le=WAIT_MAX_S, description="agents: hold the poll up to this long"
    )
    kinds: str | None = Field(
        default=None,
        max_length=KINDS_MAX_LENGTH,
        description="agents: only these kinds, comma-separated; others stay for another poller",
    )
    cluster: str | None = Field(default=None, max_length=CLUSTER_MAX_LENGTH)

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, value: str | None) -> str | None:
        names = [name.strip() for name in (value or "").split(",") if name.strip()]
        unknown = sorted(set(names) - set(CommandKind.values))
        if unknown:
            known = ", ".join(CommandKind.values)
            raise ValueError(f"unknown kind {unknown[0]!r}: one of {known}, comma-separated")
        return ",".join(names) or None

    @property
    def kind_set(self) -> frozenset[str] | None:
        """The kinds asked for; None: every kind."""
        return frozenset(self.kinds.split(",")) if self.kinds else None


class AckIn(Schema):
    state: Literal["accepted", "succeeded", "failed"]
    detail: str = Field(default="", max_length=2000, pattern=r"^[^\x00]*$")
    message: str = Field(default="", max_length=2000, pattern=r"^[^\x00]*$")
    step: int | None = Field(default=None, ge=0, le=2**63 - 1, description="checkpoint step")
    ranks: list[int] | None = Field(default=None, max_length=65536, description="ranks saving")


class PlanCheckpoint(Schema):
    step: int | None
    path: str | None
    tier: Literal["durable"]


class PlanSkipped(Schema):
    step: int
    path: str | None
    why: str


class PlanNodeSkipped(Schema):
    node: str
    state: Literal["cordoned", "draining", "down", "maintenance"]
    why: str


class PlanOut(Schema):
    run: str
    checkpoint: PlanCheckpoint | None
    nodes: list[str]
    skipped: list[PlanSkipped] = Field(
        default_factory=list,
        description="newer durable checkpoints passed over (ranks disagree, a rank failed or "
        "is unfinished, one node's claim), newest first: shown, never used",
    )
    nodes_skipped: list[PlanNodeSkipped] = Field(
        default_factory=list,
        description="nodes that served the run and are not active (down, cordoned, "
        "draining), with why: left out of `nodes`",
    )
