"""A request waits at most DB_REQUEST_TIMEOUT seconds for any one answer from Postgres.

A frozen server (SIGSTOP, a paused VM, a stalled disk) keeps every open connection open and
answers nothing: the kernel still accepts what is sent, so neither a server-side
statement_timeout nor TCP keepalives end the wait, and a request on a pooled connection hung
for as long as the freeze lasted (past an agent's 10 s timeout and gunicorn's 30 s). The
pool's connections are `BoundedConnection`s (settings: the pool's `connection_class`): while
`request_bound` is on, each wait for the server is bounded; past it the connection, in an
unknown state mid-protocol, is closed and the query raises OperationalError, which the API's
handler and DatabaseUnavailableMiddleware answer 503 + Retry-After. Outside requests (Celery
workers, commands) nothing is bounded: a worker waits out a freeze and carries on.

Imports nothing from Django: the settings module names the class."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

import psycopg
from psycopg import errors
from psycopg.abc import PQGen

RV = TypeVar("RV")

_bound_s: ContextVar[float | None] = ContextVar("db_request_bound_s", default=None)


@contextmanager
def request_bound(seconds: float) -> Iterator[None]:
    """Bound each wait for the database to `seconds` (0 or less: unbounded) in this context."""
    token = _bound_s.set(seconds if seconds > 0 else None)
    try:
        yield
    finally:
        _bound_s.reset(token)


class BoundedConnection(psycopg.Connection):
    def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        bound = _bound_s.get()
        if timeout is not None or bound is None:
            return super().wait(gen, interval=interval, timeout=timeout)
        try:
            return super().wait(gen, interval=interval, timeout=bound)
        except errors._WaitTimeout:
            self.pgconn.finish()  # the protocol is mid-message: the connection is unusable
            raise psycopg.OperationalError(
                f"no answer from the database within {bound:g} s"
            ) from None
