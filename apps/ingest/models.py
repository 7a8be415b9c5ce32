import zlib

from django.conf import settings
from django.contrib.postgres.indexes import BrinIndex
from django.db import models

from apps.clusters.models import AgentToken


class InboxBatch(models.Model):
    """A batch as accepted by the ingest API: durable before the agent hears 202.

    The worker stores its records and sets `processed_at` in the same transaction; the
    payload is then cleared, the row stays as the idempotency record of its batch_id.
    A batch that cannot be stored for a permanent reason is *quarantined* instead: it is
    processed (never claimed again), `quarantined_at` and `error` say why, and the payload
    is kept for inspection and for a retry (admin action, `batches_release`).
    """

    token = models.ForeignKey(AgentToken, on_delete=models.PROTECT, related_name="+")
    batch_id = models.CharField(max_length=128)
    received_at = models.DateTimeField(auto_now_add=True)
    payload = models.BinaryField(null=True, help_text="the JSON body as received")
    # A gzip body is kept compressed, as it came: no work for the web process, a fifth of
    # the bytes for Postgres. The worker inflates it.
    payload_encoding = models.CharField(max_length=8, default="identity")
    processed_at = models.DateTimeField(null=True, blank=True)
    quarantined_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(
        blank=True, default="", db_default="", help_text="why the batch was quarantined"
    )
    # The node name read from the body when it could be (a quarantined batch counts in its
    # node's health); empty when the body is unreadable or the name itself unstorable.
    # (db_default: batch_accept inserts with SQL of its own)
    node = models.CharField(max_length=255, blank=True, default="", db_default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["token", "batch_id"], name="inbox_unique_batch_id")
        ]
        indexes = [
            models.Index(
                fields=["id"],
                name="inbox_unprocessed",
                condition=models.Q(processed_at__isnull=True),
            ),
            models.Index(
                fields=["token", "node"],
                name="inbox_quarantined",
                condition=models.Q(quarantined_at__isnull=False),
            ),
            # rows arrive in time order: a BRIN finds the old ones for pruning at a few pages
            BrinIndex(fields=["received_at"], name="inbox_received_brin"),
        ]

    def __str__(self) -> str:
        return f"{self.token_id}/{self.batch_id}"

    @property
    def body(self) -> bytes:
        """The JSON body (inflated, at most INGEST_MAX_BODY_BYTES), or b"" once stored."""
        return decode_payload(bytes(self.payload or b""), self.payload_encoding)


class QuarantinedBatch(InboxBatch):
    """The inbox rows the worker set aside, as the admin lists them."""

    class Meta:
        proxy = True
        verbose_name = "quarantined batch"
        verbose_name_plural = "quarantined batches"


class PayloadError(ValueError):
    """A stored payload that cannot be decoded: a permanent error (the batch is quarantined)."""


def decode_payload(payload: bytes, encoding: str) -> bytes:
    """The JSON body of an inbox payload, inflated when gzip.

    Bounded like the edge: at most INGEST_MAX_BODY_BYTES decoded (inflated into a buffer of
    that size, never further), exactly one gzip member, no trailing bytes. Raises
    PayloadError otherwise."""
    limit = settings.INGEST_MAX_BODY_BYTES
    if encoding != "gzip" or not payload:
        if len(payload) > limit:
            raise PayloadError(f"body over {limit} bytes")
        return payload
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        body = inflater.decompress(payload, limit + 1)
    except zlib.error as exc:
        raise PayloadError(f"not a valid gzip stream: {exc}") from exc
    if len(body) > limit or inflater.unconsumed_tail:
        raise PayloadError(f"decoded body over {limit} bytes")
    if not inflater.eof:
        raise PayloadError("not a valid gzip stream (truncated)")
    if inflater.unused_data:
        raise PayloadError("bytes after the gzip member (a second member or trailing data)")
    return body


class RemoteSeries(models.Model):
    """A remote-written Prometheus series' last accepted sample (POST /api/v1/write).

    Its value is what the next sample's rate is taken from (counters) or compared with (the
    last XID, ECC counts); its time is the series' watermark: a sample at or before it was
    accepted already (a Prometheus replaying its WAL after a restart sends some again), so it
    is dropped, never stored twice. Updated in the transaction that accepts the batch."""

    token = models.ForeignKey(AgentToken, on_delete=models.CASCADE, related_name="+")
    # node, metric and GPU of the stored series, separated by "/" (none of them holds one)
    key = models.TextField()
    ts = models.FloatField()
    value = models.FloatField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["token", "key"], name="remoteseries_unique_key")
        ]
        # no index on `ts`: every write moves it, and an index on it would cost each update
        # its heap-only path; the hourly prune reads the table through

    def __str__(self) -> str:
        return f"{self.token_id}/{self.key}"


class RemoteFamily(models.Model):
    """A metric family's type as a Prometheus's remote-write metadata last told it.

    Prometheus sends metadata in requests of their own (every `metadata_config.send_interval`),
    not with the samples; kept here, it gives later samples their type (a histogram's `_count`
    is a counter, a gauge named `..._count` is not) in every web process."""

    token = models.ForeignKey(AgentToken, on_delete=models.CASCADE, related_name="+")
    name = models.TextField()
    type = models.CharField(max_length=16)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["token", "name"], name="remotefamily_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.token_id}/{self.name}"
