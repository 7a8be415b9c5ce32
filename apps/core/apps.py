import logging

from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "apps.core"
    label = "core"

    def ready(self) -> None:
        from django.conf import settings
        from django.db.backends.signals import connection_created

        from apps.core.db_nice import DroppedOnPurpose, backend_nice_follow

        if settings.DB_BACKEND_NICE:
            connection_created.connect(backend_nice_follow, dispatch_uid="backend_nice_follow")
        logging.getLogger("psycopg.pool").addFilter(DroppedOnPurpose())
