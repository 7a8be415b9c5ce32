"""The mixed load of issue 25 as locust users: agents posting at 1 Hz, agents holding the
command long-poll, operators' browsers on the pages. Driven by bench/mixed.py (`make load`);
also run on its own against any stack that has the seeded names and tokens:

    OPSBOARD_LOAD_CONFIG=var/load/config.json locust -f bench/locustfile.py --headless ...

The config (JSON, written by bench/mixed.py and by tests/test_load_locust.py) names the
cluster, run, nodes and their node-bound tokens, the viewer's login, how many users of each
class to start (`fixed_count`), the poll's `wait` and the browsers' think time. Each process
writes what its agents had accepted (samples, steps) to `out_dir`/accepted-<pid>.json when
the test stops, so that the driver can compare it with what was stored.

A response counts as a failure unless it is 2xx, or 429/503 with a Retry-After header (the
contract's "send the same body again later"; those are shown on rows of their own)."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import random
import re
import time
from html import unescape
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

import gevent
from locust import between, constant, constant_pacing, events, task
from locust.contrib.fasthttp import FastHttpUser
from locust.runners import MasterRunner

CONFIG = json.loads(
    Path(os.environ.get("OPSBOARD_LOAD_CONFIG", "var/load/config.json")).read_text()
)
GPUS, RANKS_PER_NODE = 8, 8
GPU_METRICS = (
    ("gpu.util", 90.0), ("gpu.mem_used_bytes", 6.0e10), ("gpu.mem_total_bytes", 8.0e10),
    ("gpu.temp_c", 70.0), ("gpu.power_w", 550.0), ("gpu.power_limit_w", 700.0),
    ("gpu.sm_clock_mhz", 1980.0), ("gpu.throttle_reasons", 0.0),
    ("gpu.nvlink_tx_bytes_per_s", 1.0e11), ("gpu.nvlink_rx_bytes_per_s", 1.0e11),
)  # fmt: skip
HOST_METRICS = (
    ("host.cpu_util", 40.0), ("host.mem_used_bytes", 1.0e12), ("host.mem_total_bytes", 2.0e12),
    ("host.net_rx_bytes_per_s", 1.2e10), ("host.net_tx_bytes_per_s", 1.1e10),
    ("host.disk_read_bytes_per_s", 1.0e9), ("host.disk_write_bytes_per_s", 5.0e8),
)  # fmt: skip
RETRYABLE = (429, 503)
MAX_ATTEMPTS = 5  # a body the server keeps refusing is counted as a failure after these
PANEL = re.compile(r'<section class="chart-panel"[^>]*>')
ATTRIBUTE = re.compile(r'data-(url|range|loading)="([^"]*)"')
CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')

# what this process's agents were told was accepted (202), for the lost-sample check
accepted = {"batches": 0, "samples": 0, "steps": 0, "duplicates": 0}


def outcome(response, retry_row: str) -> bool:
    """Mark `response` (a catch_response context) and say whether it may be retried: 2xx is
    a success; 429/503 with Retry-After a success on a row of its own (`retry_row`), to be
    retried; anything else a failure."""
    if 200 <= response.status_code < 300:
        response.success()
        return False
    if response.status_code in RETRYABLE and response.headers.get("Retry-After"):
        response.request_meta["name"] = retry_row
        response.success()
        return True
    response.failure(f"HTTP {response.status_code}: {(response.text or '')[:200]}")
    return False


def user_index(user, numbers: itertools.count) -> int:
    """A node of its own for each user of a class, across locust's worker processes (with
    `--processes`, each worker numbers its users from 0: worker i takes i, i + W, ...)."""
    worker = getattr(user.environment.runner, "worker_index", 0)
    return (next(numbers) * CONFIG.get("processes", 1) + worker) % len(CONFIG["nodes"])


def retry_after(response) -> float:
    try:
        return max(0.0, float(response.headers.get("Retry-After", "1")))
    except ValueError:
        return 1.0


class AgentUser(FastHttpUser):
    """One node's agent: a batch of one tick (10 GPU metrics × 8 GPUs + 7 host metrics; the
    run's nodes add one step report per rank) every second, gzip level 1 as the agent sends
    it, with the node's own node-bound token, on a kept-alive connection."""

    fixed_count = CONFIG["agents"]
    wait_time = constant_pacing(1)
    host = CONFIG["ingest_url"]
    network_timeout = 60.0  # bench/mixed.py's stop timeout waits this long for an answer
    _numbers = itertools.count()

    def on_start(self) -> None:
        self.index = user_index(self, self._numbers)
        self.node = CONFIG["nodes"][self.index]
        self.headers = {
            "Authorization": f"Bearer {CONFIG['tokens'][self.index]}",
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
        }
        self.ticks = 0
        self.instance = f"{os.getpid()}-{random.getrandbits(32):08x}"
        # the run's nodes continue its step series: a step a second since the run began
        self.serves_run = self.index < CONFIG["run_nodes"]
        self.first_step = int(time.time() - CONFIG["run_start"])

    @task
    def tick(self) -> None:
        batch = self.batch()
        body = gzip.compress(json.dumps(batch, separators=(",", ":")).encode(), compresslevel=1)
        for _attempt in range(MAX_ATTEMPTS):
            with self.client.post(
                "/api/v1/ingest",
                data=body,
                headers=self.headers,
                name="ingest POST",
                catch_response=True,
            ) as response:
                again = outcome(response, "ingest POST: 429/503 Retry-After")
                if not again:
                    self.count(response)
                    return
            gevent.sleep(retry_after(response))

    def batch(self) -> dict:
        self.ticks += 1
        now = time.time()
        wobble = (self.ticks % 20) / 10
        samples = [
            {"ts": now, "metric": name, "gpu": gpu, "value": base + wobble + gpu}
            for gpu in range(GPUS)
            for name, base in GPU_METRICS
        ]
        samples += [
            {"ts": now, "metric": name, "value": base + wobble} for name, base in HOST_METRICS
        ]
        batch: dict = {
            "batch_id": f"{self.node}/{self.instance}/{self.ticks}",
            "node": self.node,
            "samples": samples,
        }
        if self.ticks == 1:
            batch["node_info"] = {"gpus": GPUS, "gpu_model": "NVIDIA H100 80GB HBM3", "cpus": 96}
        if self.serves_run:
            step = self.first_step + self.ticks
            batch["run"] = CONFIG["run"]
            batch["steps"] = [
                {"ts": now, "rank": self.index * RANKS_PER_NODE + local, "step": step,
                 "step_time": 1.35 + wobble / 100, "data_time": 0.05, "h2d_time": 0.01,
                 "compute_time": 0.6, "comm_wait": 0.69 + wobble / 100, "tokens": 4096,
                 "loss": 2.0 + 8.0 / (10 + step / 600.0), "gpu": local}
                for local in range(RANKS_PER_NODE)
            ]  # fmt: skip
        return batch

    def count(self, response) -> None:
        if response.status_code == 202:
            got = response.json()["accepted"]
            accepted["batches"] += 1
            accepted["samples"] += got["samples"]
            accepted["steps"] += got["steps"]
        elif response.status_code == 200:
            accepted["duplicates"] += 1


class LongPollUser(FastHttpUser):
    """One node's command poller, as opsboard_agent's: `wait` polls back to back with the
    node's token, the first to the base URL with `X-Opsboard-Redirects: follow`, its 307
    followed to the long-poll port (same host only) and kept until a connection fails."""

    fixed_count = CONFIG["longpolls"]
    wait_time = constant(0)
    host = CONFIG["url"]
    network_timeout = CONFIG["poll_wait"] + 30.0
    _numbers = itertools.count()

    def on_start(self) -> None:
        index = user_index(self, self._numbers)
        self.headers = {
            "Authorization": f"Bearer {CONFIG['tokens'][index]}",
            "X-Opsboard-Redirects": "follow",
        }
        self.target = "/api/v1/commands?" + urlencode(
            {"node": CONFIG["nodes"][index], "wait": CONFIG["poll_wait"]}
        )
        self.base = self.held = CONFIG["url"]

    @task
    def poll(self) -> None:
        held, again, commands = self.held != self.base, False, None
        with self.client.get(
            self.held + self.target,
            headers=self.headers,
            name="poll: held" if held else "poll: to the base URL",
            allow_redirects=False,
            catch_response=True,
        ) as response:
            if response.status_code in (307, 308):
                response.success()
                self.follow(response.headers.get("Location", ""))
                return
            again = outcome(response, "poll: 429/503 Retry-After")
            if response.status_code == 200:
                commands = response.json()["commands"]
        if again:
            gevent.sleep(retry_after(response))
        elif commands is None:
            self.held = self.base  # ask the base URL again, as the agent client does
            gevent.sleep(1)
        else:
            for command in commands:
                self.ack(command["id"])

    def follow(self, location: str) -> None:
        there, here = urlsplit(location), urlsplit(self.base)
        if there.hostname == here.hostname and there.scheme == here.scheme:
            self.held = urlunsplit((there.scheme, there.netloc, "", "", ""))

    def ack(self, command_id: str) -> None:
        with self.client.post(
            f"/api/v1/commands/{command_id}/ack",
            json={"state": "succeeded", "detail": "load"},
            headers={"Authorization": self.headers["Authorization"]},
            name="poll: ack",
            catch_response=True,
        ) as response:
            outcome(response, "poll: ack 429/503 Retry-After")


class BrowserUser(FastHttpUser):
    """An operator's browser, logged in as a viewer: the cluster overview, the run page,
    a node page of the run and the alerts page in turn, each with the chart data its
    charts.js fetches (the panels marked data-loading), then `think` seconds of reading. No
    websocket: the live feed's lag is bench/ingest.py's probe."""

    fixed_count = CONFIG["browsers"]
    think = CONFIG.get("think", 5.0)
    wait_time = between(think * 0.8, think * 1.2)
    host = CONFIG["url"]
    _numbers = itertools.count()

    def on_start(self) -> None:
        self.visit = next(self._numbers)  # browsers start on different pages
        cluster, run = CONFIG["cluster"], CONFIG["run"]
        self.pages = (
            ("overview", f"/clusters/{cluster}/"),
            ("run", f"/clusters/{cluster}/runs/{run}/"),
            ("node", None),
            ("alerts", "/alerts/"),
        )
        self.login()

    def login(self) -> None:
        form = self.client.get("/accounts/login/", name="login form")
        token = CSRF.search(form.text or "")
        viewer = CONFIG["viewer"]
        with self.client.post(
            "/accounts/login/",
            data=urlencode(
                {
                    "username": viewer["username"],
                    "password": viewer["password"],
                    "csrfmiddlewaretoken": token.group(1) if token else "",
                }
            ),
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Referer": f"{self.host}/accounts/login/",
            },
            name="login",
            allow_redirects=False,
            catch_response=True,
        ) as response:
            if response.status_code == 302:  # a failed login answers 200 with the form
                response.success()
            else:
                response.failure(f"login answered {response.status_code}, not 302")

    @task
    def page(self) -> None:
        kind, path = self.pages[self.visit % len(self.pages)]
        self.visit += 1
        if path is None:
            node = CONFIG["nodes"][random.randrange(max(1, CONFIG["run_nodes"]))]
            path = f"/clusters/{CONFIG['cluster']}/nodes/{node}/"
        with self.client.get(
            path, name=f"page: {kind}", allow_redirects=False, catch_response=True
        ) as response:
            outcome(response, f"page: {kind} 429/503 Retry-After")
            html = (response.text or "") if response.status_code == 200 else ""
        for url, chart_range in self.fetched_panels(html):
            with self.client.get(
                f"{url}.json?range={chart_range}",
                name=f"charts: {kind}",
                allow_redirects=False,
                catch_response=True,
            ) as response:
                outcome(response, f"charts: {kind} 429/503 Retry-After")

    @staticmethod
    def fetched_panels(html: str) -> list[tuple[str, str]]:
        """(data-url, data-range) of each chart panel the page leaves to charts.js."""
        panels = []
        for tag in PANEL.findall(html):
            attributes = dict(ATTRIBUTE.findall(tag))
            if attributes.get("loading") == "true" and attributes.get("url"):
                panels.append((unescape(attributes["url"]), attributes.get("range") or "1h"))
        return panels


@events.test_stop.add_listener
def accepted_write(environment, **_kwargs) -> None:
    """Where users run (not locust's master, with --processes): this process's counts."""
    if isinstance(environment.runner, MasterRunner):
        return
    out = Path(CONFIG["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"accepted-{os.getpid()}.json").write_text(json.dumps(accepted))
