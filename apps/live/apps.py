from django.apps import AppConfig


class LiveConfig(AppConfig):
    name = "apps.live"
    label = "live"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out
        from django.contrib.sessions.models import Session
        from django.db.models.signals import post_delete

        from apps.core.signals import role_revoked
        from apps.live.services import on_role_revoked, on_session_deleted, on_user_logged_out

        # a socket ends with its login or its access, at once (apps.live.services)
        user_logged_out.connect(on_user_logged_out, dispatch_uid="live.close_on_logout")
        post_delete.connect(on_session_deleted, sender=Session, dispatch_uid="live.close_session")
        role_revoked.connect(on_role_revoked, dispatch_uid="live.close_on_role_revoked")
