from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "apps.audit"
    label = "audit"

    def ready(self) -> None:
        from apps.audit.services import agent_token_audit
        from apps.clusters.signals import agent_token_changed

        agent_token_changed.connect(agent_token_audit, dispatch_uid="audit-agent-tokens")
