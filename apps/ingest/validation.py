"""Validating an ingest body on the hot path: a fast check first, the full models when it
says no.

`IngestBatch.model_validate_json` builds a pydantic model per record, and that, not the
checks, is most of its cost (2.6 ms of CPU for a 1,000-sample batch). So every batch is first
decoded by msgspec into mirrors of the models: structs built from the models' own fields
(one source of truth: types, bounds, patterns, defaults), with unknown fields refused, and
the batch-wide rules run over them. That takes 0.2–0.3 ms for the same batch, against
1.0–1.5 ms for the previous fast check (TypedDict mirrors validated by pydantic-core).

A batch that passes is one the models accept too: the mirrors take the same field types and
constraints, and allow fewer bodies (no unknown field, no NaN token, anchors that do not
match before a final newline). Anything else, a bad field or a newer agent's extra field,
goes through the models, which accept it or raise the contract's errors exactly as before.
A constraint the mirror cannot express fails at import, so it is never silently dropped.
"""

from __future__ import annotations

import re
import sys
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import annotated_types
import msgspec
from pydantic import AllowInfNan, BaseModel, StringConstraints
from pydantic.fields import FieldInfo

from apps.ingest.schemas import IngestBatch, batch_problems

_FLOAT_MAX = sys.float_info.max


@dataclass(frozen=True)
class AcceptedBatch:
    batch_id: str
    node: str
    samples: int
    steps: int
    events: int


def batch_validate(body: bytes) -> AcceptedBatch:
    """The batch's id and record counts; raises as `IngestBatch.model_validate_json` does
    (BatchRejected, TooManyRecords) for a body the contract refuses."""
    try:
        data = _FAST.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError):
        data = None
    if (
        data is not None
        and _patterns_hold([data], type(data))
        and not batch_problems(
            samples=data.samples, steps=data.steps, events=data.events, run=data.run, field=getattr
        )
    ):
        return AcceptedBatch(
            data.batch_id, data.node, len(data.samples), len(data.steps), len(data.events)
        )
    batch = IngestBatch.model_validate_json(body)
    return AcceptedBatch(
        batch.batch_id, batch.node, len(batch.samples), len(batch.steps), len(batch.events)
    )


@dataclass(frozen=True)
class _Patterns:
    """A mirror's string patterns, checked after decoding over each field's distinct values
    (a 1,000-sample batch names a few dozen metrics: one match each, not one per sample),
    and the fields that hold structs with patterns of their own."""

    own: tuple[tuple[str, re.Pattern[str]], ...]
    nested: tuple[tuple[str, type, bool], ...]  # (field, struct, a list of them)


_PATTERNS: dict[type, _Patterns] = {}


def _patterns_hold(objects: list[Any], struct: type) -> bool:
    plan = _PATTERNS[struct]
    for name, pattern in plan.own:
        values = {getattr(item, name) for item in objects}
        values.discard(None)
        if not all(pattern.search(value) for value in values):
            return False
    for name, child, many in plan.nested:
        if many:
            inner = [each for item in objects for each in getattr(item, name)]
        else:
            inner = [each for item in objects if (each := getattr(item, name)) is not None]
        if inner and not _patterns_hold(inner, child):
            return False
    return True


def _mirror(model: type[BaseModel], built: dict[type, Any]) -> Any:
    """A msgspec struct with `model`'s fields (types, constraints, defaults), no extra keys."""
    if model in built:
        return built[model]
    fields: list[tuple[Any, ...]] = []
    own, nested = [], []
    for name, info in model.model_fields.items():
        annotation, pattern = _convert(info.annotation, info.metadata, built)
        if pattern is not None:
            own.append((name, re.compile(pattern)))
        child = _struct_in(annotation)
        if child is not None and _PATTERNS[child[0]] != _Patterns((), ()):
            nested.append((name, *child))
        if info.is_required():
            fields.append((name, annotation))
        elif info.default_factory is not None:
            fields.append((name, annotation, msgspec.field(default_factory=info.default_factory)))
        else:
            fields.append((name, annotation, info.default))
    struct = msgspec.defstruct(
        f"Fast{model.__name__}", fields, forbid_unknown_fields=True, kw_only=True
    )
    _PATTERNS[struct] = _Patterns(tuple(own), tuple(nested))
    built[model] = struct
    return struct


def _struct_in(annotation: Any) -> tuple[type, bool] | None:
    """The mirror struct a field holds, and whether as a list; None for other fields."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation, False
    for arg in typing.get_args(annotation):
        found = _struct_in(arg)
        if found is not None:
            return found[0], found[1] or typing.get_origin(annotation) is list
    return None


def _convert(annotation: Any, metadata: list[Any], built: dict[type, Any]) -> tuple[Any, Any]:
    """`annotation` (with pydantic's `metadata`) as a msgspec type, and the pattern its
    strings must match (checked after decoding), or None."""
    if typing.get_origin(annotation) is Annotated:
        inner, *extra = typing.get_args(annotation)
        return _convert(inner, [*metadata, *extra], built)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        _refuse(metadata, annotation)
        return _mirror(annotation, built), None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        _refuse(metadata, annotation)
        converted = [_convert(arg, [], built) for arg in args]
        patterns = {pattern for _, pattern in converted if pattern is not None}
        if len(patterns) > 1:
            raise TypeError(f"no fast mirror for {annotation!r} (two patterns)")
        union = typing.Union[tuple(kind for kind, _ in converted)]  # noqa: UP007
        return union, next(iter(patterns), None)
    if origin is list:
        item, pattern = _convert(args[0], [], built)
        if pattern is not None:
            raise TypeError(f"no fast mirror for {annotation!r} (a list of patterned strings)")
        return _constrained(list[item], metadata)  # type: ignore[valid-type]
    if origin is Literal or annotation in (str, int, float, type(None)):
        return _constrained(annotation, metadata)
    raise TypeError(f"no fast mirror for {annotation!r}")


def _refuse(metadata: list[Any], annotation: Any) -> None:
    if any(_meta_args(item) for item in metadata):
        raise TypeError(f"no fast mirror for constraints on {annotation!r}")


def _constrained(annotation: Any, metadata: list[Any]) -> tuple[Any, str | None]:
    constraints: dict[str, Any] = {}
    for item in metadata:
        _tighten(constraints, _meta_args(item))
    pattern = constraints.pop("pattern", None)
    if constraints:
        annotation = Annotated[annotation, msgspec.Meta(**constraints)]
    return annotation, pattern


_BOUNDS = {
    annotated_types.Ge: "ge",
    annotated_types.Le: "le",
    annotated_types.Gt: "gt",
    annotated_types.Lt: "lt",
    annotated_types.MinLen: "min_length",
    annotated_types.MaxLen: "max_length",
}


_TIGHTER = {"ge": max, "gt": max, "min_length": max, "le": min, "lt": min, "max_length": min}


def _tighten(constraints: dict[str, Any], more: dict[str, Any]) -> None:
    """Add `more` to `constraints`, keeping the tighter of two bounds of one kind (a finite
    float's bounds are ±1.8e308, and a field may bound it further)."""
    for name, value in more.items():
        if name in constraints:
            if name not in _TIGHTER:
                raise TypeError(f"no fast mirror for two constraints {name!r}")
            value = _TIGHTER[name](constraints[name], value)
        constraints[name] = value


def _meta_args(item: Any) -> dict[str, Any]:
    """msgspec.Meta keywords for one piece of pydantic metadata; raises for one it cannot
    express (a mirror that dropped a constraint would accept what the models refuse)."""
    if isinstance(item, FieldInfo):
        merged: dict[str, Any] = {}
        for inner in item.metadata:
            _tighten(merged, _meta_args(inner))
        return merged
    if type(item) in _BOUNDS:
        name = _BOUNDS[type(item)]
        return {name: getattr(item, name)}
    if isinstance(item, AllowInfNan):
        # finite: the largest floats bound it, and NaN fails every comparison
        return {} if item.allow_inf_nan else {"ge": -_FLOAT_MAX, "le": _FLOAT_MAX}
    if isinstance(item, StringConstraints):
        return _string_args(item)
    raise TypeError(f"no fast mirror for {item!r}")


def _string_args(item: StringConstraints) -> dict[str, Any]:
    if item.strip_whitespace or item.to_upper or item.to_lower or item.ascii_only:
        raise TypeError(f"no fast mirror for {item!r}")
    args: dict[str, Any] = {}
    if item.min_length is not None:
        args["min_length"] = item.min_length
    if item.max_length is not None:
        args["max_length"] = item.max_length
    if item.pattern is not None:
        args["pattern"] = _whole_string(str(item.pattern))
    return args


def _whole_string(pattern: str) -> str:
    """The pattern for Python's `re.search` with pydantic-core's meaning: there `$` matches
    only at the very end, in Python also before a final newline (`\\Z` is the very end)."""
    if not (pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$")):
        raise TypeError(f"no fast mirror for the pattern {pattern!r} (anchor it: ^…$)")
    return pattern[:-1] + r"\Z"


_FAST = msgspec.json.Decoder(_mirror(IngestBatch, {}))
