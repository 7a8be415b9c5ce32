from django.apps import AppConfig


class CommandsConfig(AppConfig):
    name = "apps.commands"
    label = "commands"
