from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.access.services import role_revoke
from apps.clusters.models import Cluster


class Command(BaseCommand):
    help = (
        "Remove USERNAME's role on CLUSTER (audited); their open live sockets on it close at once."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("cluster")

    def handle(self, *args, username: str, cluster: str, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no such user: {username}")
        found = Cluster.objects.filter(name=cluster).first()
        if found is None:
            raise CommandError(f"no such cluster: {cluster}")
        if not role_revoke(user=user, cluster=found):
            raise CommandError(f"{username} holds no role on {cluster}")
        self.stdout.write(f"{username} holds no role on {cluster} now")
