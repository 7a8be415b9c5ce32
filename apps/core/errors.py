"""The contract's error body: {"errors": [{"loc": "samples[3].value", "msg": "..."}]}."""

import json
from collections.abc import Iterable, Sequence
from typing import Any

from django.http import HttpResponse
from pydantic import BaseModel


def error_response(status: int, errors: list[dict[str, str]]) -> HttpResponse:
    return HttpResponse(
        json.dumps({"errors": errors}), status=status, content_type="application/json"
    )


def loc_string(loc: Sequence[Any]) -> str:
    """('samples', 3, 'value') -> 'samples[3].value'; ninja's leading 'body'/'query' dropped."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header") and len(parts) > 1:
        parts = parts[1:]
        if parts and parts[0] in ("payload", "batch", "params", "filters"):
            parts = parts[1:]
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def validation_errors(errors: Iterable[dict[str, Any]]) -> list[dict[str, str]]:
    return [
        {"loc": loc_string(err.get("loc", ())) or "body", "msg": _message(err)} for err in errors
    ]


# pydantic's wording where the contract has its own
_MESSAGES = {
    "finite_number": "must be a finite number",
    "missing": "required",
    "json_invalid": "not valid JSON",
}


def _message(err: dict[str, Any]) -> str:
    if err.get("type") in _MESSAGES:
        detail = err.get("ctx", {}).get("error") if err.get("type") == "json_invalid" else None
        return _MESSAGES[err["type"]] + (f": {detail}" if detail else "")
    msg = str(err.get("msg", "invalid"))
    # pydantic prefixes messages of custom validators with "Value error, "
    return msg.removeprefix("Value error, ")


class FieldError(Exception):
    """A request problem with one field: answered as `status` {"errors": [{loc, msg}]}."""

    def __init__(self, status: int, loc: str, msg: str) -> None:
        super().__init__(msg)
        self.status, self.loc, self.msg = status, loc, msg


class ErrorItem(BaseModel):
    loc: str
    msg: str


class Errors(BaseModel):
    """The error body's schema, for the API's documented responses."""

    errors: list[ErrorItem]
