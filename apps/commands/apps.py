from django.apps import AppConfig


class CommandsConfig(AppConfig):
    name = "apps.commands"
    label = "commands"

    def ready(self) -> None:
        from apps.commands.services import node_commands, reactions
        from apps.commands.services.core import command_ended
        from apps.commands.services.policy import on_alert_raised
        from apps.core.signals import alert_raised

        # alerts may not import commands (siblings): it announces, the policy listens
        alert_raised.connect(on_alert_raised, dispatch_uid="commands.auto_cordon")
        alert_raised.connect(node_commands.on_alert_raised, dispatch_uid="commands.node_down")
        # the state machine (services.core) sits below the reactions it sets off: it announces
        command_ended.connect(reactions.on_command_ended, dispatch_uid="commands.reactions")
