from django.contrib import admin, messages
from django.db import transaction

from apps.access.admin_scoping import ADMINISTERED, ClusterScopedAdmin
from apps.ingest.models import PayloadError, QuarantinedBatch
from apps.ingest.services import batches_release

BODY_PREVIEW_CHARS = 4000


@admin.register(QuarantinedBatch)
class QuarantinedBatchAdmin(ClusterScopedAdmin):
    """The batches the worker could not store, with why; release them after a fix. For the
    admins of the batch's cluster (the bodies are what the agents sent)."""

    cluster_path = "token__cluster"
    scope_roles = ADMINISTERED
    list_display = ["id", "cluster", "node", "batch_id", "received_at", "quarantined_at", "error"]
    list_filter = ["token__cluster"]
    search_fields = ["batch_id", "node", "error"]
    list_select_related = ["token__cluster"]
    ordering = ["-quarantined_at"]
    show_full_result_count = False
    fields = [
        "token",
        "batch_id",
        "node",
        "received_at",
        "quarantined_at",
        "error",
        "payload_encoding",
        "body_preview",
    ]
    readonly_fields = fields
    actions = ["release"]

    def get_queryset(self, request):
        return super().get_queryset(request).filter(quarantined_at__isnull=False)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_release_permission(self, request) -> bool:
        # the form stays read-only; releasing is the one change, under the change permission
        return request.user.has_perm("ingest.change_quarantinedbatch") and self.scope_allows(
            request, "change"
        )

    @admin.display(ordering="token__cluster__name")
    def cluster(self, obj) -> str:
        return str(obj.token.cluster)

    @admin.display(description="body (start)")
    def body_preview(self, obj) -> str:
        try:
            body = obj.body  # bounded inflate: a bomb is an error here too
        except PayloadError as exc:
            return f"(unreadable: {exc})"
        return body[:BODY_PREVIEW_CHARS].decode("utf-8", errors="replace")

    @admin.action(description="Retry: release from quarantine and enqueue", permissions=["release"])
    def release(self, request, queryset) -> None:
        ids = list(self.scope_queryset(request, queryset, "change").values_list("id", flat=True))
        with transaction.atomic():
            released = batches_release(ids=ids)
        self.message_user(request, f"{len(released)} batch(es) enqueued again", messages.SUCCESS)
