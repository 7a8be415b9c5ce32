from django.core.management.base import BaseCommand, CommandError

from apps.access.management.lookup import user_and_cluster
from apps.access.services import role_revoke


class Command(BaseCommand):
    help = (
        "Remove USERNAME's role on CLUSTER (audited); their open live sockets on it close at once."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("cluster")

    def handle(self, *args, username: str, cluster: str, **options):
        user, found = user_and_cluster(username, cluster)
        if not role_revoke(user=user, cluster=found):
            raise CommandError(f"{username} holds no role on {cluster}")
        self.stdout.write(f"{username} holds no role on {cluster} now")
