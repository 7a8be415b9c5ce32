"""The agent API, /api/v1/ (contract: docs/contract.md; schema: /api/v1/openapi.json)."""

import json
import math
from typing import Any

import orjson
import pydantic
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI, Swagger
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.renderers import BaseRenderer
from ninja.responses import NinjaJSONEncoder

from apps.access.api import router as audit_router
from apps.alerts.api import router as alerts_router
from apps.commands.api import router as commands_router
from apps.core.errors import FieldError, error_response, validation_errors
from apps.dashboard.api import router as dashboard_router
from apps.ingest.api import router as ingest_router
from apps.ingest.schemas import BatchRejected, IngestBatch, TooManyRecords
from apps.runs.api import router as runs_router
from apps.telemetry.api import router as telemetry_router


class StrictJSONRenderer(BaseRenderer):
    """JSON that any parser reads: NaN and ±Infinity (which json.dumps writes as bare tokens
    no JSON parser accepts) become null. orjson does that natively, and fast; what it cannot
    encode (an integer beyond 64 bits, say) goes through json with the same rule."""

    media_type = "application/json"

    def render(self, request: HttpRequest, data: Any, *, response_status: int) -> bytes:
        try:
            return orjson.dumps(data, default=_encode_other, option=orjson.OPT_NON_STR_KEYS)
        except orjson.JSONEncodeError:
            return json.dumps(_finite(data), cls=NinjaJSONEncoder, allow_nan=False).encode()


def _encode_other(value: Any) -> Any:
    return NinjaJSONEncoder().default(value)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


class OpsboardAPI(NinjaAPI):
    def get_openapi_schema(self, *args, **kwargs):
        """Ninja's schema plus the ingest body, which the view parses itself."""
        schema = super().get_openapi_schema(*args, **kwargs)
        body = IngestBatch.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(body.pop("$defs", {}))
        components["IngestBatch"] = body
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                responses = operation.get("responses", {})
                redirect = responses.get(307) or responses.get("307")  # ninja's keys are ints
                if redirect is not None:  # the long-poll, sent on to the ASGI server
                    redirect["headers"] = {
                        "Location": {
                            "description": "the same path and query, same host, another port",
                            "schema": {"type": "string", "format": "uri"},
                        }
                    }
        return schema


api = OpsboardAPI(
    title="Opsboard agent API",
    version="1",
    urls_namespace="api-v1",
    renderer=StrictJSONRenderer(),
    # Swagger UI from our own static files ("ninja" in INSTALLED_APPS), not a CDN: the offline
    # machines reach nothing outside; and no badge from the public validator service.
    docs=Swagger(settings={"validatorUrl": None}),
)
api.add_router("", ingest_router)
api.add_router("", telemetry_router)
api.add_router("", runs_router)
api.add_router("", alerts_router)
api.add_router("", audit_router)
api.add_router("", commands_router)
api.add_router("", dashboard_router)


@api.exception_handler(ValidationError)
def on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    return error_response(400, validation_errors(exc.errors))


@api.exception_handler(pydantic.ValidationError)
def on_body_error(request: HttpRequest, exc: pydantic.ValidationError) -> HttpResponse:
    return error_response(400, validation_errors(exc.errors(include_url=False)))


@api.exception_handler(BatchRejected)
def on_batch_rejected(request: HttpRequest, exc: BatchRejected) -> HttpResponse:
    return error_response(400, exc.errors)


@api.exception_handler(AuthenticationError)
def on_authentication_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return error_response(
        401, [{"loc": "Authorization", "msg": "missing, unknown or revoked token"}]
    )


@api.exception_handler(FieldError)
def on_field_error(request: HttpRequest, exc: FieldError) -> HttpResponse:
    return error_response(exc.status, [{"loc": exc.loc, "msg": exc.msg}])


@api.exception_handler(TooManyRecords)
def on_too_many_records(request: HttpRequest, exc: TooManyRecords) -> HttpResponse:
    return error_response(413, [{"loc": "body", "msg": str(exc)}])


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    return error_response(exc.status_code, [{"loc": "", "msg": str(exc)}])


@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def on_database_down(request: HttpRequest, exc: DatabaseError) -> HttpResponse:
    from django.conf import settings

    response = error_response(503, [{"loc": "", "msg": "database unavailable, retry later"}])
    response["Retry-After"] = str(settings.INGEST_RETRY_AFTER)
    return response
