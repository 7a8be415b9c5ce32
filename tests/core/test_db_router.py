"""Where the replica router sends a read (apps/core/db_router.py), decided per request;
tests/core/test_replica.py shows it against a real streaming replica."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from apps.access.models import ClusterRole
from apps.clusters.models import AgentToken, Cluster, Node
from apps.core.db_router import (
    STICKY_COOKIE,
    ReplicaMiddleware,
    ReplicaRouter,
    read_alias,
    replica_reads,
)

router = ReplicaRouter()


def _serve(request: HttpRequest, body, marked: bool = True) -> tuple[list, HttpResponse]:
    """Run `body` in a view behind the middleware; what it returned, and the response."""
    seen: list = []

    def view(request: HttpRequest) -> HttpResponse:
        seen.append(body())
        return HttpResponse("ok")

    response = ReplicaMiddleware(replica_reads(view) if marked else view)(request)
    return seen, response


def test_it_reads_a_marked_page_get_from_the_replica() -> None:
    seen, response = _serve(RequestFactory().get("/"), lambda: router.db_for_read(Node))
    assert seen == ["replica"]
    assert STICKY_COOKIE not in response.cookies


def test_it_reads_an_unmarked_view_from_the_primary() -> None:
    seen, _ = _serve(RequestFactory().get("/"), lambda: router.db_for_read(Node), marked=False)
    assert seen == [None]


def test_it_reads_outside_a_request_from_the_primary() -> None:
    assert router.db_for_read(Node) is None  # a worker, a command, a consumer


@pytest.mark.parametrize("model", [User, ClusterRole, AgentToken])
def test_it_reads_who_may_do_what_from_the_primary(model) -> None:
    seen, _ = _serve(RequestFactory().get("/"), lambda: router.db_for_read(model))
    assert seen == [None]


def _browser(request: HttpRequest) -> HttpRequest:
    request.COOKIES["sessionid"] = "x"
    return request


def test_it_reads_a_post_from_the_primary_and_makes_its_client_sticky() -> None:
    post = _browser(RequestFactory().post("/"))
    seen, response = _serve(post, lambda: router.db_for_read(Node))
    assert seen == [None]
    assert response.cookies[STICKY_COOKIE]["max-age"] > 0


def test_it_sets_no_cookie_for_an_agent_that_posts() -> None:
    _, response = _serve(RequestFactory().post("/api/v1/ingest"), lambda: None)
    assert STICKY_COOKIE not in response.cookies


def test_it_reads_a_sticky_client_from_the_primary() -> None:
    request = RequestFactory().get("/")
    request.COOKIES[STICKY_COOKIE] = "1"
    seen, _ = _serve(request, lambda: router.db_for_read(Node))
    assert seen == [None]


def test_it_reads_after_a_write_from_the_primary_and_makes_its_client_sticky() -> None:
    def write_then_read() -> str | None:
        assert router.db_for_write(Cluster) == "default"
        return router.db_for_read(Node)

    seen, response = _serve(_browser(RequestFactory().get("/")), write_then_read)
    assert seen == [None]
    assert STICKY_COOKIE in response.cookies


@pytest.mark.django_db(transaction=True)  # no test-wide atomic block around it
def test_it_reads_inside_an_atomic_block_from_the_primary() -> None:
    def in_and_out_of_atomic() -> tuple[str | None, str | None]:
        with transaction.atomic():
            inside = router.db_for_read(Node)
        return inside, router.db_for_read(Node)

    seen, _ = _serve(RequestFactory().get("/"), in_and_out_of_atomic)
    assert seen == [(None, "replica")]


def test_it_migrates_the_primary_only() -> None:
    assert router.allow_migrate("default", "clusters") is True
    assert router.allow_migrate("replica", "clusters") is False


def test_a_selectors_own_sql_reads_the_primary_where_no_replica_is_configured() -> None:
    # the router's answer inside a marked GET is "replica"; raw SQL must not name a
    # database that this deployment does not have
    seen, _ = _serve(RequestFactory().get("/"), lambda: (router.db_for_read(Node), read_alias()))
    assert seen == [("replica", "default")]
