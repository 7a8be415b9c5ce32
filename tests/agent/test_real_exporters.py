"""Debian's own node_exporter and process-exporter on loopback, the real agent scraping
both (`--scrape node=URL --scrape process=URL`) into the live stack, and what was stored
checked against the exporters' own output: every exposed series is there under its target
(or deliberately filtered), one value per timestamp, none merged into the other target's.

CI installs the exporters (.ci/run) and fails if they are missing; elsewhere the test is
skipped with the apt-get line that installs them."""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.db import connection

from launcher.procs import free_port, http_ok, wait_until
from opsboard_agent.records import sanitize_metric
from tests.agent.conftest import REPO

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]

NODE = "exporters-node"
BINARIES = {"node": "prometheus-node-exporter", "process": "prometheus-process-exporter"}
INSTALL = "apt-get install prometheus-node-exporter prometheus-process-exporter"
AGENT_SECONDS = 5  # of our own scrapes, once the agent delivers
# The agent stores what a contract sample can carry: these labels are identity, not series.
DROPPED_LABELS = {"job", "instance"}
RATE = ".rate"  # the suffix of a counter's per-second rate (docs/agent.md)


def exporter_binaries() -> dict[str, str]:
    found = {target: shutil.which(binary) for target, binary in BINARIES.items()}
    missing = sorted(BINARIES[t] for t, path in found.items() if path is None)
    if missing:
        message = f"{', '.join(missing)} not installed; install with `{INSTALL}`"
        if os.environ.get("CI"):
            pytest.fail(f"CI runs this test against the real exporters, but {message}")
        pytest.skip(message)
    return found  # type: ignore[return-value]


# --- the exporters' own output, parsed here (not with the agent's parser) ----------------

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
_TYPE = re.compile(r"^#\s+TYPE\s+(\S+)\s+(\S+)")


@dataclass(frozen=True)
class Exposed:
    name: str  # the sample name as exposed
    labels: tuple[tuple[str, str], ...]
    value: float
    kind: str  # its family's TYPE (untyped when none)


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def exposition(text: str) -> list[Exposed]:
    types: dict[str, str] = {}
    samples = []
    for line in text.splitlines():
        if match := _TYPE.match(line):
            types[match.group(1)] = match.group(2)
            continue
        if not line.strip() or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not an exposition line: {line!r}"
        name, labels, value = match.group(1), match.group(2) or "", match.group(3)
        family = next(
            (name[: -len(s)] for s in ("_sum", "_count", "_bucket") if name.endswith(s)), name
        )
        kind = types.get(name) or types.get(family, "untyped")
        pairs = tuple(sorted((k, _unescape(v)) for k, v in _LABEL.findall(labels)))
        samples.append(Exposed(name, pairs, float(value), kind))
    return samples


def stored_name(target: str, sample: Exposed) -> str | None:
    """The name the agent stores this exposed sample under (docs/agent.md), None when it is
    deliberately not stored."""
    if not math.isfinite(sample.value):
        return None
    if sample.name.endswith("_created") and sample.kind != "gauge":
        return None
    if sample.kind == "histogram" and sample.name.endswith("_bucket"):
        return None  # no --scrape-buckets here
    labels = [(k, v) for k, v in sample.labels if v != "" and k not in DROPPED_LABELS]
    folded = sample.name + "".join(f".{k}_{v}" for k, v in labels)
    return sanitize_metric(f"{target}:{folded}", suffix=RATE if cumulative(sample) else "")


def cumulative(sample: Exposed) -> bool:
    """Stored as a per-second rate: counters, a summary's or histogram's `_sum`/`_count`,
    untyped series named like a counter."""
    if sample.kind in ("summary", "histogram"):
        return sample.name.endswith(("_sum", "_count"))
    return sample.kind == "counter" or (sample.kind == "untyped" and sample.name.endswith("_total"))


def scrape(url: str) -> list[Exposed]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return exposition(response.read().decode())


# --- processes -----------------------------------------------------------------------------


def start(command: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def exporters(tmp_path):
    """{target: metrics URL} of both exporters, running on free loopback ports."""
    binaries = exporter_binaries()
    ports = {target: free_port() for target in binaries}
    commands = {
        "node": [binaries["node"], f"--web.listen-address=127.0.0.1:{ports['node']}"],
        # Only the two exporters' own processes (their comm names, cut to 15 characters),
        # so that the process groups do not come and go with the machine's other work.
        "process": [
            binaries["process"],
            f"-web.listen-address=127.0.0.1:{ports['process']}",
            "-procnames=prometheus-node,prometheus-proc",
            "-threads=false",
            "-gather-smaps=false",
        ],
    }
    running = []
    try:
        for target, command in commands.items():
            running.append(start(command, tmp_path / f"{target}-exporter.log"))
            time.sleep(0.2)  # distinct process_start_time_seconds (1/100 s ticks)
        urls = {t: f"http://127.0.0.1:{port}/metrics" for t, port in ports.items()}
        for target, url in urls.items():
            wait_until(lambda url=url: http_ok(url), 30, f"the {target} exporter")
        yield urls
    finally:
        for process in running:
            stop(process)


def stored_points(token) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """Every stored point of the node: {(metric, gpu): [(ts, value), …]} (gpu -1: host)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT m.name, c.gpu, extract(epoch FROM c.t0)::float8 + u.o / 1000.0, u.v"
            " FROM telemetry_chunk c JOIN telemetry_metric m ON m.id = c.metric_id"
            " JOIN clusters_node n ON n.id = c.node_id,"
            " unnest(c.offsets_ms, c.vals) AS u(o, v)"
            " WHERE n.name = %s AND n.cluster_id = %s",
            [NODE, token.cluster_id],
        )
        points = defaultdict(list)
        for name, gpu, ts, value in cursor.fetchall():
            points[(name, gpu)].append((round(ts, 3), value))
    return points


def test_two_real_exporters_are_stored_apart_and_whole(
    live_stack, agent_token, live_db, exporters, tmp_path
):
    from apps.ingest.models import InboxBatch

    token, secret = agent_token
    token_file = tmp_path / "token"
    token_file.write_text(secret)
    agent = start(
        [
            sys.executable,
            "-m",
            "opsboard_agent",
            "run",
            "--server",
            live_stack.url,
            "--token-file",
            str(token_file),
            "--node",
            NODE,
            "--scrape",
            f"node={exporters['node']}",
            "--scrape",
            f"process={exporters['process']}",
            "--interval",
            "1",
            "--no-gpu",
            "--spool-dir",
            str(tmp_path / "spool"),
            "--log-level",
            "WARNING",
        ],  # fmt: skip
        tmp_path / "agent.log",
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    # Our own scrapes while the agent runs (from its first stored batch on): a series in all
    # of them must be stored (its counters have a rate by then); one stored must be in one
    # of them, of its own target.
    seen: dict[str, list[list[Exposed]]] = {target: [] for target in exporters}
    try:
        wait_until(
            lambda: InboxBatch.objects.filter(token=token, processed_at__isnull=False).exists(),
            60,
            "the agent's first batch",
        )
        started = time.monotonic()
        while time.monotonic() - started < AGENT_SECONDS:
            for target, url in exporters.items():
                seen[target].append(scrape(url))
            time.sleep(0.5)
    finally:
        stop(agent)
    log = (tmp_path / "agent.log").read_text()
    assert agent.returncode == 0, log
    assert "Traceback" not in log and "failed" not in log, log
    wait_until(
        lambda: not InboxBatch.objects.filter(token=token, processed_at__isnull=True).exists(),
        60,
        "the worker to store every batch",
    )
    points = stored_points(token)
    # A tick a second for AGENT_SECONDS, gathered ten a batch (the default --batch-seconds)
    ticks = len(points[("agent.collector_errors", -1)])
    assert ticks >= AGENT_SECONDS > InboxBatch.objects.filter(token=token).count()
    check_one_value_per_timestamp(points)
    stored = {name for name, _ in points}
    for target in exporters:
        check_target(target, seen, {n for n in stored if n.startswith(f"{target}:")})
    check_nothing_else_stored(stored, exporters)
    check_constant_gauges(points, seen)
    rates = {key: s for key, s in points.items() if key[0].endswith(RATE)}
    assert len(rates) > 100 and all(v >= 0 for s in rates.values() for _, v in s)
    check_the_listing_api(live_stack.url, secret, stored)


_STARTED: dict[int, float] = {}


def agent_started(process: subprocess.Popen) -> float:
    return _STARTED.setdefault(process.pid, time.monotonic() - 2.5)


def check_one_value_per_timestamp(points: dict) -> None:
    doubled = {
        key: [ts for ts, n in Counter(ts for ts, _ in series).items() if n > 1]
        for key, series in points.items()
    }
    doubled = {key: stamps for key, stamps in doubled.items() if stamps}
    assert not doubled, f"{len(doubled)} series with several values at one instant: " + str(
        dict(list(doubled.items())[:5])
    )


def check_target(target: str, seen: dict, stored: set[str]) -> None:
    scrapes = [{stored_name(target, s) for s in one} - {None} for one in seen[target]]
    always, ever = set.intersection(*scrapes), set.union(*scrapes)
    assert len(always) > (400 if target == "node" else 40), (target, len(always))
    missing = always - stored
    assert not missing, (
        f"{target}: {len(missing)} exposed series not stored: {sorted(missing)[:10]}"
    )
    # A series that came and went between our scrapes (a thread's wait channel) may be
    # stored without us seeing it: its family must then be one this target alone exposes.
    families = {t: {s.name for one in seen[t] for s in one} for t in seen}
    others = set().union(*(f for t, f in families.items() if t != target))
    unexplained = {
        name
        for name in stored - ever
        if not (_family(name, target) in families[target] and _family(name, target) not in others)
    }
    assert not unexplained, f"{target}: stored, never exposed by it: {sorted(unexplained)[:10]}"
    filtered = {s.name for one in seen[target] for s in one if stored_name(target, s) is None}
    assert not {n for n in stored if _family(n, target) in filtered and n not in ever}


def _family(stored: str, target: str) -> str:
    return stored.removeprefix(f"{target}:").split(".", 1)[0]


def check_nothing_else_stored(stored: set[str], exporters: dict) -> None:
    """Every scraped series carries its target; what has none is the agent's own."""
    prefixes = tuple(f"{target}:" for target in exporters)
    others = sorted(n for n in stored if not n.startswith(prefixes))
    assert others, "the agent's own series (host.*, agent.*) are missing"
    assert all(n.startswith(("host.", "agent.")) for n in others), others


def check_constant_gauges(points: dict, seen: dict) -> None:
    """Gauges that never change in a process's life read back as each exporter's own value,
    so neither target's series holds the other's samples."""
    starts = {}
    for target in seen:
        exposed = {s.name: s.value for s in seen[target][-1] if not s.labels}
        for gauge in ("process_start_time_seconds", "process_max_fds"):
            values = {v for _, v in points[(f"{target}:{gauge}", -1)]}
            assert values == {exposed[gauge]}, (target, gauge, values, exposed[gauge])
        starts[target] = exposed["process_start_time_seconds"]
    assert starts["node"] != starts["process"]  # else the check above proves nothing


def check_the_listing_api(url: str, secret: str, stored: set[str]) -> None:
    response = httpx.get(
        f"{url}/api/v1/nodes/{NODE}/series",
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    counts = {s["source"]: s["series"] for s in response.json()["sources"]}
    for target in ("node", "process"):
        assert counts[target] == len({n for n in stored if n.startswith(f"{target}:")})
