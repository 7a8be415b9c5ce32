"""The Celery application: `celery -A opsboard worker` finds `app` here."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "opsboard.settings")

app = Celery("opsboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
