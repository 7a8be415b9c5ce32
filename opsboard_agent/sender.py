"""Delivery of spooled batches to POST /api/v1/ingest, with the contract's retry discipline.

- 202, or 200 with `duplicate`: delivered; the batch leaves the spool.
- 503 / 429: overloaded; wait `Retry-After` (or back off when it is missing), same body.
- 400, 401, 403, 413, 415, 422: the server will never take this body; logged, counted in
  `rejected`, dropped. Retrying would block everything behind it.
- Anything else (connection refused/reset, timeouts, other 5xx, 404 from a wrong URL):
  exponential backoff with full jitter, forever; the spool's cap bounds what waits.

Batches go one at a time, oldest first, so the server sees a node's data in order.
`server` and `token` are plain attributes: a test (or a config reload) may change them.
"""

from __future__ import annotations

import email.utils
import gzip
import http.client
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from opsboard_agent.spool import Entry, Spool
from opsboard_agent.tls import server_connection

log = logging.getLogger(__name__)

INGEST_PATH = "/api/v1/ingest"
REJECTED = frozenset({400, 401, 403, 413, 415, 422})
OVERLOADED = frozenset({429, 503})
GZIP_MIN_BYTES = 2048


@dataclass
class SenderStats:
    attempts: int = 0
    delivered: int = 0
    duplicates: int = 0
    rejected: int = 0
    retries: int = 0


def backoff_delay(failures: int, *, base: float, cap: float, rng: Callable[[], float]) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**(failures-1))]. Spreads a fleet of
    agents that all lost the server at once instead of having them return in lockstep."""
    ceiling = min(cap, base * 2 ** max(0, failures - 1))
    return rng() * ceiling


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class Sender:
    """Sends the spool's batches from a background thread (`start`/`stop`), or one attempt
    at a time (`send_once`, for tests and tools)."""

    def __init__(
        self,
        spool: Spool,
        *,
        server: str,
        token: str,
        timeout: float = 10.0,
        backoff_base: float = 0.5,
        backoff_cap: float = 60.0,
        retry_after_cap: float = 600.0,
        rng: Callable[[], float] = random.random,
        ca_file: str | None = None,
    ) -> None:
        self.spool = spool
        self.ca_file = ca_file
        self.server = server
        self.token = token
        self.timeout = timeout
        self.backoff_base, self.backoff_cap = backoff_base, backoff_cap
        self.retry_after_cap = retry_after_cap
        self.rng = rng
        self.stats = SenderStats()
        self._failures = 0
        self._connection: http.client.HTTPConnection | None = None
        self._connection_key: tuple[str, str] | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._closing = False
        self._deadline = float("inf")
        self._thread: threading.Thread | None = None

    # -- one attempt ---------------------------------------------------------------------

    def send_once(self) -> float | None:
        """Try to deliver the oldest batch. Returns None when the spool is empty, 0.0 when
        the batch was settled (delivered or dropped), else the seconds to wait first."""
        entry = self.spool.oldest()
        if entry is None:
            return None
        self.stats.attempts += 1
        try:
            with self.spool.sending(entry.seq):
                status, headers, body = self._post(entry)
        except (OSError, http.client.HTTPException) as exc:
            self._close_connection()
            return self._retry_later(entry, f"{type(exc).__name__}: {exc}")
        if status == 202 or status == 200:
            self.spool.remove(entry.seq)
            self._failures = 0
            if status == 200:
                self.stats.duplicates += 1
            self.stats.delivered += 1
            return 0.0
        if status in REJECTED:
            self.spool.remove(entry.seq)
            self.stats.rejected += 1
            self._failures = 0
            log.error(
                "batch %s rejected with %d, dropped: %s",
                entry.batch_id,
                status,
                body[:500].decode("utf-8", "replace"),
            )
            return 0.0
        if status in OVERLOADED:
            wait = parse_retry_after(headers.get("Retry-After"))
            if wait is not None:
                self.stats.retries += 1
                log.info(
                    "server overloaded (%d); retrying %s in %.1f s", status, entry.batch_id, wait
                )
                return min(wait, self.retry_after_cap)
        return self._retry_later(entry, f"HTTP {status}")

    def _retry_later(self, entry: Entry, why: str) -> float:
        self._failures += 1
        self.stats.retries += 1
        delay = backoff_delay(
            self._failures, base=self.backoff_base, cap=self.backoff_cap, rng=self.rng
        )
        level = (
            logging.WARNING
            if self._failures in (1, 5) or self._failures % 50 == 0
            else logging.DEBUG
        )
        log.log(
            level,
            "sending %s failed (%s, %d in a row); retrying in %.2f s",
            entry.batch_id,
            why,
            self._failures,
            delay,
        )
        return delay

    def _post(self, entry: Entry) -> tuple[int, dict[str, str], bytes]:
        url = urlsplit(self.server)
        body = entry.body
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        if len(body) >= GZIP_MIN_BYTES:
            # Level 1: a node's batch (names repeated thousands of times) shrinks ~10x at
            # half the CPU of level 5, which gains only another 15 %.
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        connection = self._get_connection(url.scheme, url.netloc)
        connection.request("POST", url.path.rstrip("/") + INGEST_PATH, body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
        if response.getheader("Connection", "").lower() == "close":
            self._close_connection()
        return response.status, {k: v for k, v in response.getheaders()}, data

    def _get_connection(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        if self._connection is None or self._connection_key != (scheme, netloc):
            self._close_connection()
            self._connection = server_connection(scheme, netloc, self.timeout, self.ca_file)
            self._connection_key = (scheme, netloc)
        return self._connection

    def _close_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
        self._connection = None

    # -- the background loop -------------------------------------------------------------

    def notify(self) -> None:
        """A new batch is spooled: stop idling."""
        self._wake.set()

    def start(self) -> Sender:
        self._thread = threading.Thread(target=self._run, name="opsboard-sender", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            if self._closing and (len(self.spool) == 0 or time.monotonic() >= self._deadline):
                break
            self._wake.clear()
            try:
                delay = self.send_once()
            except Exception:  # never let one odd batch kill delivery for good
                log.exception("sender: unexpected error")
                delay = 1.0
            if delay == 0.0:
                continue
            if self._closing:
                remaining = self._deadline - time.monotonic()
                if delay is None or remaining <= 0:
                    break
                time.sleep(min(delay, remaining))
                continue
            if delay is None:
                self._wake.wait(0.5)  # idle until notify(); the poll is a safety net
            else:
                # A retry wait is not cut short by new batches, only by stop().
                self._stop.wait(delay)
        self._close_connection()

    def stop(self, drain_timeout: float = 5.0) -> None:
        """Keep delivering for up to `drain_timeout` seconds (until the spool is empty),
        then stop. What is left stays spooled for the next start."""
        self._deadline = time.monotonic() + drain_timeout
        self._closing = True
        self._wake.set()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(drain_timeout + self.timeout + 1)
