"""apps.core.db_wait: within a request, no answer from Postgres is awaited longer than
DB_REQUEST_TIMEOUT; past it the request is answered 503 with Retry-After, and the next
request gets a working connection. A table lock held by another session stands in for a
server that does not answer (a frozen one: tests/faults/test_freeze.py)."""

import time

import psycopg
from django.db import close_old_connections, connection
from django.test import Client

from apps.clusters.models import AgentToken
from tests.stackproc import database_url


def test_it_answers_503_when_the_database_does_not_answer_in_time(agent_token, settings):
    token, secret = agent_token
    settings.DB_REQUEST_TIMEOUT = 0.5
    client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    read = "/api/v1/series?node=n&metric=m"
    with psycopg.connect(database_url(connection.settings_dict)) as locker:
        # were the request not bounded, it would wait until the server ends this session
        locker.execute("SET idle_in_transaction_session_timeout = '5s'")
        locker.execute(f"LOCK TABLE {AgentToken._meta.db_table} IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        response = client.get(read)
        took = time.monotonic() - started
    assert response.status_code == 503
    assert int(response["Retry-After"]) > 0
    assert took < 3
    close_old_connections()  # as Django does after each request (the test client does not)
    assert client.get(read).status_code == 404, "a fresh connection: the node is unknown"
