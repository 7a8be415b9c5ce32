from django.core.management.base import BaseCommand

from apps.access.choices import Role
from apps.access.management.lookup import user_and_cluster
from apps.access.services import role_grant


class Command(BaseCommand):
    help = "Give USERNAME the role ROLE (viewer, operator, admin) on CLUSTER."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("cluster")
        parser.add_argument("role", choices=Role.values)

    def handle(self, *args, username: str, cluster: str, role: str, **options):
        user, found = user_and_cluster(username, cluster)
        role_grant(user=user, cluster=found, role=role)
        self.stdout.write(f"{username} is {role} on {cluster}")
