from django.core.management.base import BaseCommand

from apps.clusters.services import token_issue


class Command(BaseCommand):
    help = "Create CLUSTER if needed and print a new agent token (shown only this once)."

    def add_arguments(self, parser):
        parser.add_argument("cluster")
        parser.add_argument("--name", default="")

    def handle(self, *args, cluster: str, name: str, **options):
        token, secret = token_issue(cluster_name=cluster, name=name)
        self.stderr.write(f"token {token.prefix}… for cluster {cluster} (stored only as a digest)")
        self.stdout.write(secret)
