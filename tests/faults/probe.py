"""Reads that are not ingest, asked over and over during a fault: a page behind a session
(read from the database), the login page, an API read behind an agent token, the readiness
probe. Whatever else they answer, none may answer 500, and none may hang."""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx

TIMEOUT_S = 30.0


class Prober:
    def __init__(self, url: str, secret: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=TIMEOUT_S)
        self.requests = {
            "page": ("/", {"Cookie": "sessionid=0123456789abcdefghijklmnopqrstuv"}),
            "login": ("/accounts/login/", {}),
            "api": (
                "/api/v1/series?node=node-0&metric=gpu.util",
                {"Authorization": f"Bearer {secret}"},
            ),
            "readyz": ("/readyz", {}),
        }
        self.answers: Counter[tuple[str, int]] = Counter()
        self.failures: list[str] = []  # 500s, and 503s without Retry-After (not the probe's)
        self.longest_s = 0.0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Prober:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, (path, headers) in self.requests.items():
                started = time.monotonic()
                try:
                    response = self.http.get(path, headers=headers)
                except httpx.HTTPError as error:
                    self.answers[(name, 0)] += 1
                    self.failures.append(f"{name}: {error!r}")
                    continue
                finally:
                    self.longest_s = max(self.longest_s, time.monotonic() - started)
                status = response.status_code
                self.answers[(name, status)] += 1
                if status >= 500 and status != 503:
                    self.failures.append(f"{name}: {status} {response.text[:200]}")
                elif status == 503 and name != "readyz" and "Retry-After" not in response.headers:
                    self.failures.append(f"{name}: 503 without Retry-After")
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(2 * TIMEOUT_S)
        self.http.close()

    def summary(self) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for (name, status), count in sorted(self.answers.items()):
            out.setdefault(name, {})[status] = count
        return out
