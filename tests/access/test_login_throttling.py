"""Logins are throttled (django-axes): after AXES_FAILURE_LIMIT failures for a username from
one address, even the right password is refused until the cool-off."""

import pytest
from django.conf import settings
from django.test import Client

from tests.access.conftest import PASSWORD, user_with

pytestmark = pytest.mark.django_db


def login(client: Client, password: str):
    return client.post("/accounts/login/", {"username": "vera", "password": password})


def test_it_locks_a_username_out_after_repeated_failures(clusters):
    user_with("vera", alpha="viewer")
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert login(client, "wrong").status_code == 200  # the form again, with an error
    assert login(client, PASSWORD).status_code == 302  # a success resets the count
    for _ in range(settings.AXES_FAILURE_LIMIT):
        login(client, "wrong")
    locked = login(Client(), PASSWORD)
    assert locked.status_code == 429
