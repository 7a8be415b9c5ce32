"""`manage.py demo_operator` prints the demo's login, and a working one every time it runs."""

import re
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def printed_login(*args: str) -> tuple[str, str]:
    out = StringIO()
    call_command("demo_operator", *args, stdout=out)
    return out.getvalue(), re.search(r"password\s+(\S+)", out.getvalue()).group(1)


def test_it_prints_the_url_username_and_a_password_that_logs_in():
    box, password = printed_login("--url", "http://127.0.0.1:8123/")
    assert "http://127.0.0.1:8123/" in box and re.search(r"username\s+operator", box)
    assert "manage.py demo_operator" in box  # how to see a login again
    user = get_user_model().objects.get(username="operator")
    assert user.is_superuser and user.is_active and user.check_password(password)


def test_run_again_it_prints_a_new_password_and_the_old_one_stops_working():
    _, first = printed_login()
    _, second = printed_login()
    user = get_user_model().objects.get(username="operator")
    assert first != second
    assert user.check_password(second) and not user.check_password(first)
    assert get_user_model().objects.filter(username="operator").count() == 1
