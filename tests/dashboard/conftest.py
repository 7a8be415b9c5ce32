"""Fixtures of the dashboard tests: a cluster whose data went through the real storage
service (apps.ingest.services.batches_store), and logged-in operators."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from apps.access.models import ClusterRole
from apps.clusters.models import Cluster
from apps.ingest.services import ClaimedBatch, batches_store

PASSWORD = "a-long-test-password"
RUN = "run-1"


def gpu_samples(ts: float, gpus: int, temp: float = 60.0) -> list[dict]:
    return [
        {"ts": ts, "metric": metric, "gpu": gpu, "value": value}
        for gpu in range(gpus)
        for metric, value in (
            ("gpu.util", 90.0 + gpu),
            ("gpu.temp_c", temp),
            ("gpu.mem_used_bytes", 60e9),
            ("gpu.mem_total_bytes", 80e9),
            ("gpu.power_w", 500.0),
            ("gpu.throttle_reasons", 0.0),
        )
    ]


def step_reports(ts: float, step: int, ranks: range, slow_rank: int | None = None) -> list[dict]:
    reports = []
    for rank in ranks:
        compute = 0.9 if rank == slow_rank else 0.6
        checked = step % 5 == 0
        reports.append(
            {
                "ts": ts, "rank": rank, "step": step, "step_time": 1.0, "data_time": 0.03,
                "h2d_time": 0.01, "compute_time": compute, "comm_wait": 0.96 - compute,
                "tokens": 1000, "loss": 10.0 / (1 + step),
                **({"grad_checksum": f"g{step}", "param_checksum": f"p{step}",
                    "canary": {"norm": 3.0, "proj": [0.1, 0.2]}} if checked else {}),
            }
        )  # fmt: skip
    return reports


def cluster_store(
    name: str, *, nodes: int = 2, gpus: int = 4, steps: int = 10, now: float | None = None
) -> Cluster:
    """`steps` seconds of a cluster training RUN on all its GPUs (one rank per GPU), stored
    through the ingest storage service; a local and a durable checkpoint at step 5, and an
    XID 79 on node-00 GPU 1."""
    now = time.time() if now is None else now
    cluster = Cluster.objects.create(name=name)
    batches = []
    for index in range(nodes):
        ranks = range(index * gpus, (index + 1) * gpus)
        for step in range(steps):
            ts = now - steps + step + 1
            body = {
                "batch_id": f"{name}-{index}-{step}", "node": f"node-{index:02d}",
                "node_info": {"gpus": gpus}, "run": RUN,
                "samples": gpu_samples(ts, gpus), "steps": step_reports(ts, step, ranks),
                "events": [],
            }  # fmt: skip
            if index == 0 and step == 5:
                body["events"] = [
                    {"ts": ts, "kind": "checkpoint", "step": 5, "tier": tier, "state": "completed"}
                    for tier in ("local", "durable")
                ] + [{"ts": ts, "kind": "xid", "gpu": 1, "code": 79, "message": "fell off the bus"}]
            batches.append(body)
    received = datetime.fromtimestamp(now, UTC)
    batches_store(batches=[ClaimedBatch.of(cluster.id, received, body) for body in batches])
    return cluster


def operator(username: str = "op", *, may_acknowledge: bool = True):
    """An operator of every cluster (a superuser: clusters are often created after it), or
    with may_acknowledge=False a viewer of the clusters that exist."""
    if may_acknowledge:
        return get_user_model().objects.create_superuser(username, password=PASSWORD)
    user = get_user_model().objects.create_user(username, password=PASSWORD)
    for cluster in Cluster.objects.all():
        ClusterRole.objects.create(user=user, cluster=cluster, role="viewer")
    return user


@pytest.fixture
def cluster(db):
    return cluster_store("alpha")


@pytest.fixture
def client_in(db) -> Client:
    client = Client()
    client.force_login(operator())
    return client


@pytest.fixture(scope="module")
def chromium():
    """The machine's Chromium, headless (as tests/live/test_live_page.py drives it)."""
    import os

    from playwright.sync_api import sync_playwright

    from tests.browser import CHROMIUM_ARGS, chromium_path

    # Playwright's sync API keeps an event loop on this thread; the ORM calls of the test
    # itself are synchronous all the same (the documented pytest-django/Playwright setting).
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()
    del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


class BrowserPage:
    """A logged-in page of its own browser context that records console errors."""

    def __init__(self, browser, base_url: str, username: str) -> None:
        from tests.browser import log_in

        self.context = browser.new_context(viewport={"width": 1400, "height": 900})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []  # every URL the page asked for (no CDN: all ours)
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        log_in(self.page, base_url, username, PASSWORD)

    def close(self) -> None:
        self.context.close()
