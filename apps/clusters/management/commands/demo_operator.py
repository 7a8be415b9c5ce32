"""`manage.py demo_operator`: the demo's login, created or reset, printed in a box.

`make demo` runs it at start-up and prints its box once the stack is up; run it again to see
a login. Django keeps only a hash of a password, so showing the login again means setting a
new password: every run resets it (the previous one stops working and its browser
sessions are logged out).
"""

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

AGAIN = ".venv/bin/python manage.py demo_operator"


def login_box(*, url: str, username: str, password: str) -> str:
    """The login as a framed block of text, easy to find in a terminal."""
    lines = [
        f"Opsboard demo: {url}",
        f"  username  {username}",
        f"  password  {password}",
        "",
        "Show a login again (sets a new password):",
        f"  {AGAIN}",
    ]
    width = max(len(line) for line in lines)
    rule = "+" + "-" * (width + 4) + "+"
    return "\n".join([rule, *(f"|  {line.ljust(width)}  |" for line in lines), rule])


class Command(BaseCommand):
    help = (
        "Create or reset the demo operator (a superuser) and print its login: the URL, the "
        "username and a new password (the previous password stops working)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--username", default="operator")
        parser.add_argument("--password", help="the new password (default: a random one)")
        parser.add_argument(
            "--url",
            default=f"http://127.0.0.1:{os.environ.get('PORT', '8000')}/",
            help="the dashboard's address, as printed (default: http://127.0.0.1:$PORT/)",
        )

    def handle(self, *args, username: str, password: str | None, url: str, **options):
        password = password or secrets.token_urlsafe(12)
        user, _ = get_user_model().objects.get_or_create(username=username)
        user.is_staff = user.is_superuser = user.is_active = True
        user.set_password(password)
        user.save()
        self.stdout.write(login_box(url=url, username=username, password=password))
