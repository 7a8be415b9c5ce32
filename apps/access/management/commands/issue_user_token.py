from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.access.services import user_token_issue


class Command(BaseCommand):
    help = "Print a new personal API token for USERNAME (shown only this once)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="")

    def handle(self, *args, username: str, name: str, **options):
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"no such active user: {username}")
        token, secret = user_token_issue(user=user, name=name)
        self.stderr.write(f"token {token.prefix}… for {username} (stored only as a digest)")
        self.stdout.write(secret)
