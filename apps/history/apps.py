from django.apps import AppConfig


class HistoryConfig(AppConfig):
    name = "apps.history"
    label = "history"
