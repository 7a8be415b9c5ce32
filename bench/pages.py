"""History benchmark: every dashboard page and chart endpoint, and the history selectors, over
a seeded run of 256 ranks on 32 nodes × 8 GPUs (`--ranks`), timed server side against a 300 ms
target.

    make bench                     # or: python bench/pages.py --hours 72 --reps 7
    python bench/pages.py --hours 6 --reps 3   # a quick check
    python bench/pages.py --reuse --skip selectors,raw,generic --only bench-run/,step_time
                                               # the pages again, on what the last run seeded

Seeds a scratch database `opsboard_bench_pages` (on DATABASE_URL's server, else the embedded
one) with server-side SQL: 1 Hz samples of four GPU metrics as sealed 10-minute chunks (what
compaction leaves) and one step report per rank per second, ending now. Rollups are then
built by the real code path (`rollups_rebuild`: dirty ranges → `rollups_refresh`). Prints:
  - seeding and rollup-build times, rows and bytes on disk;
  - each selector over 15m / 6h / 24h / 72h: resolution, median and p95 (ms);
  - the same query read from raw data and from the rollup, side by side;
  - 10 repetitions as server-side prepared statements with generic plans forced, against
    Django's default (client-side binding, a fresh plan each time);
  - every page and chart-data URL of apps/dashboard (in-process Django test client).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench.common as common  # noqa: E402
import bench.pages_seed as pages_seed  # noqa: E402
from bench.common import percentile, prepare_database  # noqa: E402
from bench.pages_seed import (  # noqa: E402
    CLUSTER,
    FLEET,
    FLEET_BLOCK,
    RUN,
    rollups_build,
    seed,
)

common.BENCH_DB = f"{common.BENCH_DB}_pages"  # its own scratch database: others drop theirs

TARGET_MS = 300.0
RANGES = {"15m": 900, "6h": 6 * 3600, "24h": 24 * 3600, "72h": 72 * 3600}
CHART_RANGES = ("15m", "1h", "6h", "24h", "all")
RAW_TIMED_ONCE = 5_000_000  # raw points (series × seconds) above which a raw read runs once
WINDOW = 600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=72.0, help="history to seed (72)")
    parser.add_argument(
        "--ranks", type=int, default=pages_seed.RANKS, help="ranks to seed, 8 a node (256)"
    )
    parser.add_argument(
        "--fleet", type=int, default=4096, help="nodes of the fleet cluster's overview (4096)"
    )
    parser.add_argument("--reps", type=int, default=7, help="repetitions per timing (7)")
    parser.add_argument("--page-reps", type=int, default=3, help="repetitions per URL (3)")
    parser.add_argument(
        "--reuse", action="store_true", help="time the database the last run seeded again"
    )
    parser.add_argument(
        "--rollups", action="store_true", help="with --reuse: rebuild the rollups first"
    )
    parser.add_argument(
        "--skip",
        default="",
        help="skip sections (selectors,raw,generic,pages) and URLs containing a word",
    )
    parser.add_argument(
        "--only", default="", help="time only the URLs containing one of these words (a,b)"
    )
    args = parser.parse_args()
    pages_seed.NODES, pages_seed.RANKS = max(1, args.ranks // pages_seed.GPUS), args.ranks
    pages_seed.SLOW_RANK %= args.ranks

    if args.reuse:
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(os.environ["DATABASE_URL"])
        os.environ["DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{common.BENCH_DB}"))
    else:
        env, conninfo = prepare_database()
        os.environ.update(env)
    os.environ["ALLOWED_HOSTS"] = "127.0.0.1,localhost,testserver"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "opsboard.settings")
    import django

    django.setup()

    if args.reuse:
        ids, start, end = seeded()
        args.hours = (end - start) / 3600
        from apps.clusters.models import Cluster

        if not Cluster.objects.filter(name=FLEET).exists():  # seeded before the fleet was
            pages_seed.fleet_seed(nodes=args.fleet)
        if args.rollups:
            rollups_build(conninfo=common.conninfo(os.environ["DATABASE_URL"]), start=start,
                          end=end, fresh=True)  # fmt: skip
    else:
        end = time.time() // WINDOW * WINDOW
        start = end - round(args.hours * 3600 / WINDOW) * WINDOW
        ids = seed(conninfo=conninfo, start=start, end=end)
        rollups_build(conninfo=conninfo, start=start, end=end)
        pages_seed.fleet_seed(nodes=args.fleet)
    ending = time.strftime("%H:%M", time.gmtime(end))
    print(f"{pages_seed.RANKS:,} ranks, {args.hours:g} h of history ending {ending} UTC")

    table = Table()
    if "selectors" not in args.skip:
        selector_timings(table, ids=ids, end=end, hours=args.hours, reps=args.reps)
    if "raw" not in args.skip:
        raw_vs_rollup(table, ids=ids, end=end, hours=args.hours, reps=max(2, args.reps // 2))
    if "generic" not in args.skip:
        generic_plans(table, ids=ids, end=end)
    if "pages" not in args.skip:
        skip = [word for word in args.skip.split(",") if word]
        only = [word for word in args.only.split(",") if word]
        page_timings(table, reps=args.page_reps, skip=skip, only=only, end=end)
    table.print()


def seeded() -> tuple[dict[str, Any], float, float]:
    """Ids and time span of what an earlier run seeded (for --reuse)."""
    from apps.clusters.models import Node
    from apps.runs.models import Run

    run = Run.objects.get(cluster__name=CLUSTER, name=RUN)
    nodes = list(Node.objects.filter(cluster=run.cluster).order_by("name"))
    ids = {"nodes": [node.id for node in nodes], "run": run.id}
    return ids, run.created_at.timestamp(), run.last_step_at.timestamp() + 1


class Table:
    """Rows of (what, resolution, median ms, p95 ms), printed against TARGET_MS."""

    def __init__(self) -> None:
        self.sections: list[tuple[str, list[tuple[str, str, float, float]]]] = []

    def section(self, title: str) -> None:
        self.sections.append((title, []))
        print(f"-- {title}", flush=True)

    def add(self, what: str, resolution: str, times_ms: list[float]) -> None:
        median, p95 = statistics.median(times_ms), percentile(times_ms, 95)
        self.sections[-1][1].append((what, resolution, median, p95))
        print(f"   {what:<58} {resolution:>10} {median:9.1f} {p95:9.1f}", flush=True)

    def print(self) -> None:
        print(f"\n{'':<60} {'resolution':>10} {'median ms':>10} {'p95 ms':>9}  target 300 ms")
        for title, rows in self.sections:
            print(f"{title}")
            for what, resolution, median, p95 in rows:
                verdict = "ok" if p95 <= TARGET_MS else "OVER"
                print(f"  {what:<58} {resolution:>10} {median:10.1f} {p95:9.1f}  {verdict}")


def timed(call: Callable[[], Any], reps: int, warm: bool = True) -> tuple[list[float], Any]:
    """Milliseconds of each of `reps` calls (after one warm-up call), and the last result."""
    result = call() if warm else None
    times = []
    for _ in range(reps):
        began = time.perf_counter()
        result = call()
        times.append((time.perf_counter() - began) * 1000)
    return times, result


def selector_cases(ids: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """Selector calls as the pages make them, each taking (start, end, res or None)."""
    from apps.history.selectors.metrics import metric_history, metric_history_at
    from apps.history.selectors.steps import (
        run_rank_history,
        run_rank_history_at,
        run_step_history,
        run_step_history_at,
    )

    def metric(nodes: list[int], gpu: Any) -> Callable[..., Any]:
        def call(start: float, end: float, res: Any = None) -> Any:
            args = {"node_ids": nodes, "metric": "gpu.util", "gpu": gpu, "start": start}
            if res is None:
                return metric_history(**args, end=end)
            return metric_history_at(**args, end=end, res=res)

        return call

    def steps(
        whole: Callable[..., Any], at: Callable[..., Any], max_points: int = 1000
    ) -> Callable[..., Any]:
        def call(start: float, end: float, res: Any = None) -> Any:
            if res is None:
                return whole(run_id=ids["run"], start=start, end=end, max_points=max_points)
            return at(run_id=ids["run"], start=start, end=end, res=res)

        return call

    nodes, ranks = f"{len(ids['nodes'])} nodes", f"{pages_seed.RANKS} ranks"
    return {
        "metric_history 1 node, 1 GPU": metric(ids["nodes"][:1], 3),
        "metric_history 1 node, all 8 GPUs": metric(ids["nodes"][:1], "all"),
        f"metric_history {nodes}, all GPUs ({pages_seed.RANKS} series)": metric(
            ids["nodes"], "all"
        ),
        "run_step_history (run as a whole)": steps(run_step_history, run_step_history_at),
        f"run_rank_history {ranks}": steps(run_rank_history, run_rank_history_at),
        f"run_rank_history {ranks}, 120 points (the heat-map)": steps(
            run_rank_history, run_rank_history_at, max_points=120
        ),
    }


def _ranges(hours: float) -> dict[str, int]:
    return {key: span for key, span in RANGES.items() if span <= hours * 3600}


def _res_text(result: Any) -> str:
    return f"{result.resolution_s:g} s" if result.resolution_s else "raw pts"


def selector_timings(table: Table, *, ids: dict, end: float, hours: float, reps: int) -> None:
    table.section("selectors (as the pages call them, max_points = 1000)")
    for name, call in selector_cases(ids).items():
        for key, span in _ranges(hours).items():
            times, result = timed(lambda c=call, s=span: c(end - s, end), reps)
            table.add(f"{name} {key}", _res_text(result), times)


def raw_vs_rollup(table: Table, *, ids: dict, end: float, hours: float, reps: int) -> None:
    """The same bucketed query answered from raw data and from the rollup."""
    from apps.history.selectors import Resolution

    table.section("raw vs rollup, same query and bucket width")
    steps = {"6h": (60, "1m"), "24h": (120, "1m"), "72h": (300, "1m")}
    for name, call in selector_cases(ids).items():
        if "1 GPU" in name:
            continue
        for key, span in _ranges(hours).items():
            if key not in steps:
                continue
            step, source = steps[key]
            # a raw read of many series over a day or more takes many seconds: time it once
            heavy = span * (8 if "1 node" in name else pages_seed.RANKS) > RAW_TIMED_ONCE
            for src in ("raw", source):
                res = Resolution(step=step, source=src)
                times, _ = timed(
                    lambda c=call, s=span, r=res: c(end - s, end, r),
                    1 if heavy and src == "raw" else reps,
                    warm=not (heavy and src == "raw"),
                )
                table.add(f"{name} {key} from {src}", f"{step} s", times)


def generic_plans(table: Table, *, ids: dict, end: float) -> None:
    from launcher.plans import prepared_generic_plans

    table.section("10 repetitions: client-side binding vs prepared with generic plans")
    for name, call in selector_cases(ids).items():
        for key, span in (("15m", 900), ("24h", 86400)):
            start = end - span
            custom, expected = timed(lambda c=call, s=start: c(s, end), 10)
            table.add(f"{name} {key} custom plans", _res_text(expected), custom)
            with prepared_generic_plans():
                generic, result = timed(lambda c=call, s=start: c(s, end), 10)
            same = "same result" if _same(result.to_dict(), expected.to_dict()) else "DIFFERS"
            table.add(f"{name} {key} generic plans ({same})", _res_text(result), generic)


def _same(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-9 relative (a plan may sum the same values in another order)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def page_urls() -> list[str]:
    """Every page and chart-data URL of the dashboard (charts read from its registries)."""
    pages = ["/", "/alerts/", f"/clusters/{CLUSTER}/", f"/clusters/{CLUSTER}/runs/{RUN}/"]
    pages.append(f"/clusters/{CLUSTER}/nodes/node-00/")
    # the fleet's overview (blocks of nodes) and one block's cards
    pages += [f"/clusters/{FLEET}/", f"/clusters/{FLEET}/?block={quote(FLEET_BLOCK)}"]
    try:
        from apps.dashboard.charts import NODE_CHARTS, RUN_CHARTS
    except ImportError:  # the dashboard app is not there yet: selectors only
        return []
    for chart in RUN_CHARTS:
        base = f"/clusters/{CLUSTER}/runs/{RUN}/charts/{chart}.json"
        pages += [f"{base}?range={key}" for key in CHART_RANGES]
    for chart in NODE_CHARTS:
        base = f"/clusters/{CLUSTER}/nodes/node-00/charts/{chart}.json"
        pages += [f"{base}?range={key}" for key in CHART_RANGES]
    return pages


def page_timings(table: Table, *, reps: int, skip: list[str], only: list[str], end: float) -> None:
    """Every URL, with the wall clock moved back to the seed's end: the pages then see the
    run live (its last step a second ago), as an operator would, however long ago the seed
    ended, and "15m" means the run's last 15 minutes rather than an empty range."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    urls = [url for url in page_urls() if not any(word in url for word in skip)]
    urls = [url for url in urls if not only or any(word in url for word in only)]
    if not urls:
        return
    table.section(
        "dashboard pages and chart data (in-process test client, clock at the seed's end)"
    )
    from apps.access.services import role_grant
    from apps.clusters.models import Cluster

    user, _ = get_user_model().objects.get_or_create(username="bench", is_staff=True)
    # pages show only the clusters the user holds a role in (404 otherwise): a viewer's view
    for cluster in Cluster.objects.filter(name__in=[CLUSTER, pages_seed.FLEET]):
        role_grant(user=user, cluster=cluster, role="viewer")
    client = Client()
    client.force_login(user)
    real_time, offset = time.time, time.time() - end
    time.time = lambda: real_time() - offset  # noqa: E731 - every module's time.time()
    try:
        for url in urls:
            status = client.get(url).status_code
            times, response = timed(lambda u=url: client.get(u), reps)
            size = f"{len(response.content) / 1024:,.0f} KiB"  # the body: bounded too
            # what a browser receives where the view gzips (the charts: gzip_page)
            packed = client.get(url, HTTP_ACCEPT_ENCODING="gzip")
            if packed.get("Content-Encoding") == "gzip":
                size += f", {len(packed.content) / 1024:,.0f} KiB gzipped"
            table.add(f"{url} [{size}]" if status == 200 else f"{url} [HTTP {status}]", "", times)
    finally:
        time.time = real_time


if __name__ == "__main__":
    main()
