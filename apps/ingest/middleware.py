"""Size limit and gzip decoding for the ingest endpoint, before Django parses anything.

The limit is on the *decoded* body (contract: 8 MiB), so a small gzip bomb is cut off
while it is inflated, not after. A gzip body is one member with nothing after it, as the
worker reads it (apps.ingest.models.decode_payload).
"""

import zlib

from django.conf import settings

from apps.core.counters import counter_add
from apps.core.errors import error_response

INGEST_PATH = "/api/v1/ingest"
# Prometheus remote write (apps.ingest.api.remote_write): snappy protobuf, its own decoding
REMOTE_WRITE_PATH = "/api/v1/write"
# What the ingest pool serves (settings: OPSBOARD_ROLE=ingest); /readyz and /metrics are
# answered before this check, by apps.metrics.middleware.ProbeMiddleware
INGEST_POOL_PATHS = frozenset({INGEST_PATH, REMOTE_WRITE_PATH, "/healthz"})
# opsboard_ingest_batches_total{outcome, status} (apps.metrics): every answer to a POST;
# opsboard_remote_write_requests_total{outcome, status} the same for remote write
INGEST_BATCHES = "opsboard_ingest_batches_total"
REMOTE_WRITE_REQUESTS = "opsboard_remote_write_requests_total"
# opsboard_remote_write_samples_total{outcome}: accepted, replayed, dropped, refused
REMOTE_WRITE_SAMPLES = "opsboard_remote_write_samples_total"
COUNTED = {INGEST_PATH: INGEST_BATCHES, REMOTE_WRITE_PATH: REMOTE_WRITE_REQUESTS}
OUTCOMES = {202: "accepted", 200: "duplicate"}


class IngestCountMiddleware:
    """Counts every answer to POST /api/v1/ingest (and /api/v1/write) by outcome and status:
    accepted (202), duplicate or nothing new (200), refused (anything else, from any
    middleware or view after this one: 400 bad body, 401 token, 403 node, 413 size, 415
    encoding, 429 rate, 503 database). In memory, flushed to Redis by a thread
    (apps.core.counters): no round trip here."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        counter = COUNTED.get(request.path_info)
        if request.method == "POST" and counter is not None:
            status = response.status_code
            outcome = OUTCOMES.get(status, "refused")
            counter_add(counter, {"outcome": outcome, "status": str(status)})
        return response


class IngestOnlyMiddleware:
    """The ingest pool's first check: any path but the ingest endpoint and /healthz is 404.
    Its middleware chain has no sessions, CSRF or users, so nothing that needs them may be
    served from it, whatever reaches its port."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path_info not in INGEST_POOL_PATHS:
            return error_response(
                404,
                [
                    {
                        "loc": "path",
                        "msg": "the ingest pool serves POST /api/v1/ingest and /api/v1/write only",
                    }
                ],
            )
        return self.get_response(request)


class IngestBodyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path == INGEST_PATH and request.method == "POST":
            problem = self._decode(request)
            if problem is not None:
                return problem
        return self.get_response(request)

    def _decode(self, request):
        limit = settings.INGEST_MAX_BODY_BYTES
        length = int(request.META.get("CONTENT_LENGTH") or 0)
        if length > limit:
            return _too_large(limit)
        body = request.body
        encoding = request.META.get("HTTP_CONTENT_ENCODING", "identity").strip().lower()
        if encoding == "gzip":
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            try:
                decoded = inflater.decompress(body, limit + 1)
            except zlib.error:
                return error_response(400, [{"loc": "body", "msg": "not a valid gzip stream"}])
            if len(decoded) > limit or inflater.unconsumed_tail:
                return _too_large(limit)
            if not inflater.eof:
                return error_response(
                    400, [{"loc": "body", "msg": "not a valid gzip stream (truncated)"}]
                )
            if inflater.unused_data:
                # a second member would be inflated by a reader that takes every member
                # (each under the limit, their sum not): one member, nothing after it
                return error_response(
                    400,
                    [{"loc": "body", "msg": "one gzip member only, with nothing after it"}],
                )
            request._body = decoded
            request.ingest_wire_body = body  # stored as it came (see InboxBatch.payload)
        elif encoding not in ("identity", ""):
            return error_response(
                415, [{"loc": "Content-Encoding", "msg": f"unsupported encoding {encoding!r}"}]
            )
        return None


def _too_large(limit: int):
    return error_response(413, [{"loc": "body", "msg": f"decoded body over {limit} bytes"}])
