from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.access.choices import Role
from apps.access.services import role_grant
from apps.clusters.models import Cluster


class Command(BaseCommand):
    help = "Give USERNAME the role ROLE (viewer, operator, admin) on CLUSTER."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("cluster")
        parser.add_argument("role", choices=Role.values)

    def handle(self, *args, username: str, cluster: str, role: str, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no such user: {username}")
        found = Cluster.objects.filter(name=cluster).first()
        if found is None:
            raise CommandError(f"no such cluster: {cluster}")
        role_grant(user=user, cluster=found, role=role)
        self.stdout.write(f"{username} is {role} on {cluster}")
