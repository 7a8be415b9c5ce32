import gzip

from django.db import models

from apps.clusters.models import AgentToken


class InboxBatch(models.Model):
    """A batch as accepted by the ingest API: durable before the agent hears 202.

    The worker stores its records and sets `processed_at` in the same transaction; the
    payload is then cleared, the row stays as the idempotency record of its batch_id.
    """

    token = models.ForeignKey(AgentToken, on_delete=models.PROTECT, related_name="+")
    batch_id = models.CharField(max_length=128)
    received_at = models.DateTimeField(auto_now_add=True)
    payload = models.BinaryField(null=True, help_text="the JSON body as received")
    # A gzip body is kept compressed, as it came: no work for the web process, a fifth of
    # the bytes for Postgres. The worker inflates it.
    payload_encoding = models.CharField(max_length=8, default="identity")
    processed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["token", "batch_id"], name="inbox_unique_batch_id")
        ]
        indexes = [
            models.Index(
                fields=["id"],
                name="inbox_unprocessed",
                condition=models.Q(processed_at__isnull=True),
            )
        ]

    def __str__(self) -> str:
        return f"{self.token_id}/{self.batch_id}"

    @property
    def body(self) -> bytes:
        """The JSON body (inflated), or b"" once processed."""
        return decode_payload(bytes(self.payload or b""), self.payload_encoding)


def decode_payload(payload: bytes, encoding: str) -> bytes:
    return gzip.decompress(payload) if encoding == "gzip" and payload else payload
