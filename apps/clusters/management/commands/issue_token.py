from django.core.management.base import BaseCommand, CommandError

from apps.clusters.hostlist import PatternError
from apps.clusters.services import token_issue


class Command(BaseCommand):
    help = (
        "Create CLUSTER if needed and print a new agent token (shown only this once): for "
        "every node of the cluster, or with --node only for those nodes."
    )

    def add_arguments(self, parser):
        parser.add_argument("cluster")
        parser.add_argument("--name", default="")
        parser.add_argument(
            "--node",
            action="append",
            default=[],
            dest="nodes",
            metavar="NAME",
            help="a node this token acts for, or a pattern such as gpu-[001-128]; repeatable. "
            "Without it the token is cluster-wide (simulators, launchers).",
        )

    def handle(self, *args, cluster: str, name: str, nodes: list[str], **options):
        try:
            token, secret = token_issue(cluster_name=cluster, name=name, nodes=nodes)
        except PatternError as error:
            raise CommandError(f"--node {error}") from None
        scope = f"nodes {', '.join(token.nodes)}" if nodes else "every node (cluster-wide)"
        self.stderr.write(
            f"token {token.prefix}… for cluster {cluster}, acting for {scope}"
            " (stored only as a digest)"
        )
        self.stdout.write(secret)
