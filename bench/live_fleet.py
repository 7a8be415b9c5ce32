"""Live overview of a fleet in Chromium: time to first render, and to apply one second's deltas
for every node (issue 27), with the messages a second the browser got.

    python bench/live_fleet.py                    # 4,096 nodes × 8 GPUs, 3 seconds of deltas
    python bench/live_fleet.py --reuse            # on the fleet the last run seeded
    python bench/live_fleet.py --nodes 1024 --seconds 5
    python bench/live_fleet.py --reuse --flush 0 --js-from HEAD~1   # a before, to compare

Seeds a scratch database `opsboard_bench_live` (on DATABASE_URL's server, else the embedded
one) with `--nodes` nodes × 8 GPUs and the host, their latest health; starts the web server,
the websocket server and the live publisher (bench/common.py; no Celery: nothing is ingested)
with OVERVIEW_NODE_CARDS at the fleet's size, so that the overview is the live cards page.
Headless Chromium opens it; a script added before the page's own times, in the page, each
socket message: from its arrival to the end of its draw (overview.js draws in a microtask
after the message's events: JSON.parse, the events and every DOM write), and to the end of
the next frame (style, layout, paint). Then, `--seconds` times, every node changes once in
one second as ingest would change it: in 10 rounds a tenth of the nodes' health is stored
and the nodes are marked dirty (apps.live.services.live_mark_dirty, what ingest does after
commit); the publisher sends them, each socket coalesces them (LIVE_SOCKET_FLUSH_S).
Prints:
  - first render: the response, DOMContentLoaded, first contentful paint (the server-drawn
    cards) and the snapshot drawn (the live state), from navigation start;
  - each second: the messages the browser got, their nodes and bytes, the time to apply them
    (sum of arrival → draw done) and to the frame after, and until every node was drawn;
  - messages a second: the most in any second from the first delta (bound 1 / flush).
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench.common as common  # noqa: E402
from bench.common import BenchStack, prepare_database  # noqa: E402

common.BENCH_DB = f"{common.BENCH_DB}_live"  # its own scratch database: others drop theirs
CLUSTER, GPUS, ROUNDS, USER = "fleet", 8, 10, "bench"
PASSWORD = secrets.token_urlsafe(16)

# Every socket message, timed in the page (added before the page's scripts run).
HOOK = """(() => {
  const records = window.__live = [];
  let current = null;
  const count = (e) => { if (current) current.nodes += e.detail.nodes.length; };
  document.addEventListener("opsboard:snapshot", count);
  document.addEventListener("opsboard:delta", count);
  const setter = Object.getOwnPropertyDescriptor(WebSocket.prototype, "onmessage").set;
  Object.defineProperty(WebSocket.prototype, "onmessage", {
    configurable: true,
    set(handler) {
      setter.call(this, (event) => {
        const at = performance.now();
        const type = (/^\\{"type":"(\\w+)"/.exec(event.data) || [])[1];
        const record = current = { at, type, bytes: event.data.length, nodes: 0 };
        handler.call(this, event);
        current = null;
        // overview.js draws in a microtask the handler queued: this one runs after it
        queueMicrotask(() => {
          record.apply_ms = performance.now() - at;
          records.push(record);
          const framed = () => { record.frame_ms = performance.now() - at; };
          requestAnimationFrame(() => setTimeout(framed));
        });
      });
    },
  });
})();"""

FIRST_RENDER = """() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const paint = performance.getEntriesByType("paint")
    .find((p) => p.name === "first-contentful-paint");
  const snap = window.__live.find((r) => r.type === "snapshot");
  return { response_ms: nav.responseEnd, dom_ms: nav.domContentLoadedEventEnd,
           fcp_ms: paint ? paint.startTime : null,
           html_bytes: nav.transferSize || nav.encodedBodySize,
           snapshot_ms: snap.at + snap.apply_ms, snapshot_frame_ms: snap.at + snap.frame_ms,
           snapshot_apply_ms: snap.apply_ms, snapshot_bytes: snap.bytes,
           snapshot_nodes: snap.nodes };
}"""

# The health of one second's change: node i's GPU (i + k) % 8 warm (a warning), others cool.
_CHANGE_SQL = """
UPDATE telemetry_nodehealth h
SET ts = now(), values = jsonb_build_object('gpu.util', 90.0, 'gpu.temp_c',
    CASE WHEN h.gpu = (substr(n.name, 6)::int + %(k)s) %% 8 THEN 82.0 ELSE 60.0 END)
FROM clusters_node n WHERE n.id = h.node_id AND n.id = ANY(%(ids)s::int8[]);
UPDATE clusters_node SET last_seen = now() WHERE id = ANY(%(ids)s::int8[]);
"""
_HEALTH_SQL = """
INSERT INTO telemetry_nodehealth (node_id, gpu, ts, values)
SELECT n.id, g, now(), jsonb_build_object('gpu.util', 90.0, 'gpu.temp_c', 60.0)
FROM unnest(%(nodes)s::int8[]) n(id) CROSS JOIN generate_series(-1, 7) g
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4096, help="nodes of the fleet (4096)")
    parser.add_argument("--seconds", type=int, default=3, help="seconds of deltas (3)")
    parser.add_argument("--reuse", action="store_true", help="the fleet the last run seeded")
    parser.add_argument(
        "--flush", type=float, help="LIVE_SOCKET_FLUSH_S for the stack (0: each delta at once)"
    )
    parser.add_argument(
        "--js-from", help="serve overview.js and live-socket.js as at this git revision"
    )
    args = parser.parse_args()

    env = reuse_environment() if args.reuse else prepare_database()[0]
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "opsboard.settings")
    import django

    django.setup()
    from django.conf import settings

    cluster_id, ids = fleet(args.nodes)
    flush_s = settings.LIVE_SOCKET_FLUSH_S if args.flush is None else args.flush
    stack_env = {**env, "OVERVIEW_NODE_CARDS": str(len(ids)), "LIVE_SOCKET_FLUSH_S": str(flush_s)}
    stack = BenchStack(stack_env, web_workers=2, concurrency=1)
    for role in ("worker", "periodic"):  # nothing is ingested; no detectors over the fleet
        stack.commands.pop(role, None)
    stack.start()
    try:
        scripts = (
            {name: git_show(args.js_from, f"static/js/{name}") for name in JS}
            if args.js_from
            else {}
        )
        measure(stack, cluster_id, ids, args.seconds, flush_s, scripts)
    finally:
        stack.stop()


JS = ("overview.js", "live-socket.js")


def git_show(revision: str, path: str) -> str:
    """A file as at a revision (read from git's objects; the work tree is left alone)."""
    return subprocess.run(
        ["git", "show", f"{revision}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def serving(text: str):
    """A Playwright route handler that answers with this script."""
    return lambda route: route.fulfill(body=text, content_type="text/javascript")


def reuse_environment() -> dict[str, str]:
    """As prepare_database leaves it, on the scratch database the last run seeded."""
    env = dict(os.environ)
    env.setdefault("OPSBOARD_VAR_DIR", str(ROOT / "var" / "bench"))
    parts = urlsplit(env["DATABASE_URL"])
    env["DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{common.BENCH_DB}"))
    env["OPSBOARD_REDIS_PREFIX"] = f"opsboard-bench-{os.getpid()}"
    env.update(DEBUG="false", SECRET_KEY=secrets.token_urlsafe(50), PYTHONUNBUFFERED="1",
               SECURE_SSL_REDIRECT="false", SESSION_COOKIE_SECURE="false",
               CSRF_COOKIE_SECURE="false")  # fmt: skip
    command = ["collectstatic", "--noinput", "-v", "0"]  # the page's scripts as they are now
    subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, check=True)
    return env


def fleet(nodes: int) -> tuple[int, list[int]]:
    """The fleet (seeded unless there), its nodes seen now; and a superuser to log in as."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from apps.clusters.models import Cluster, Node

    cluster = Cluster.objects.filter(name=CLUSTER).first()
    if cluster is None:
        cluster = Cluster.objects.create(name=CLUSTER)
        created = Node.objects.bulk_create(
            Node(cluster=cluster, name=f"node-{i:04d}", last_seen=timezone.now(),
                 info={"gpus": GPUS})
            for i in range(nodes)
        )  # fmt: skip
        with connection.cursor() as cursor:
            cursor.execute(_HEALTH_SQL, {"nodes": [node.id for node in created]})
        print(f"seeded a fleet of {nodes:,} nodes × {GPUS} GPUs", flush=True)
    ids = list(Node.objects.filter(cluster=cluster).order_by("name").values_list("id", flat=True))
    Node.objects.filter(cluster=cluster).update(last_seen=timezone.now())
    users = get_user_model().objects
    user = users.filter(username=USER).first() or users.create_superuser(USER, password=PASSWORD)
    user.set_password(PASSWORD)
    user.save()
    return cluster.id, ids


def second_of_deltas(cluster_id: int, ids: list[int], k: int) -> None:
    """Every node changes once within one second, a tenth every 100 ms, as ingest would."""
    from django.db import connection

    from apps.live.services import live_mark_dirty

    started = time.monotonic()
    for number in range(ROUNDS):
        time.sleep(max(0.0, started + number / ROUNDS - time.monotonic()))
        chunk = ids[number::ROUNDS]
        with connection.cursor() as cursor:
            cursor.execute(_CHANGE_SQL, {"k": k, "ids": chunk})
        live_mark_dirty(nodes={(cluster_id, node_id) for node_id in chunk})


def measure(
    stack: BenchStack,
    cluster_id: int,
    ids: list[int],
    seconds: int,
    flush_s: float,
    scripts: dict[str, str],
) -> None:
    from playwright.sync_api import sync_playwright

    from launcher.browser import chromium_find

    # Playwright's sync API keeps an event loop on this thread; the ORM calls here are
    # synchronous all the same (as the browser tests set it: tests/dashboard/conftest.py)
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium_find(), headless=True,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"],
        )  # fmt: skip
        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        for name, text in scripts.items():  # --js-from: the page's scripts of another revision
            page.route(f"**/static/js/{name.split('.')[0]}*.js", serving(text))
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{stack.url}/accounts/login/?next=/alerts/")  # not the fleet, untimed
        page.fill("input[name=username]", USER)
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_load_state()
        page.add_init_script(HOOK)
        began = time.monotonic()
        page.goto(f"{stack.url}/clusters/{CLUSTER}/", timeout=300_000)
        page.wait_for_function(
            "() => window.__live.some((r) => r.type === 'snapshot' && r.frame_ms)",
            timeout=300_000,
        )
        wall = time.monotonic() - began
        first = page.evaluate(FIRST_RENDER)
        cards = page.locator(".node-card").count()
        bound = f"at most {1 / flush_s:g} messages a second" if flush_s else "no bound"
        older = f", {' and '.join(scripts)} of another revision" if scripts else ""
        print(f"\n{cards:,} node cards × {GPUS} GPUs, live (LIVE_SOCKET_FLUSH_S {flush_s} s: "
              f"{bound}{older})")  # fmt: skip
        print(
            f"first render (from navigation start): response {first['response_ms']:.0f} ms, "
            f"DOMContentLoaded {first['dom_ms']:.0f} ms, first contentful paint "
            f"{first['fcp_ms'] or 0:.0f} ms (the server's cards, {first['html_bytes'] / 1e6:.1f} "
            f"MB of HTML); snapshot drawn {first['snapshot_ms']:.0f} ms, its frame "
            f"{first['snapshot_frame_ms']:.0f} ms ({first['snapshot_nodes']:,} nodes, "
            f"{first['snapshot_bytes'] / 1e6:.1f} MB, applied in {first['snapshot_apply_ms']:.0f} "
            f"ms); {wall:.1f} s wall clock to the live state"
        )
        page.wait_for_timeout(2000)  # the start's own messages pass
        applies, frames, rates = [], [], []
        for k in range(1, seconds + 1):
            mark = page.evaluate("performance.now()")
            started = time.monotonic()
            second_of_deltas(cluster_id, ids, k)
            page.wait_for_function(
                f"""() => document.querySelectorAll('.tile[data-state="warning"]').length
                          === {len(ids)}""",
                timeout=60_000, polling=50,
            )  # fmt: skip
            drawn = time.monotonic() - started
            page.wait_for_timeout(max(2 * flush_s, 0.5) * 1000)  # any message still coming
            got = page.wait_for_function(
                f"""() => {{ const got = window.__live.filter((r) => r.at >= {mark});
                             return got.every((r) => r.frame_ms !== undefined) && got; }}"""
            ).json_value()
            if not got:
                raise SystemExit(f"second {k}: no message reached the page")
            apply_ms, frame_ms = sum(r["apply_ms"] for r in got), sum(r["frame_ms"] for r in got)
            seconds_in = [int((r["at"] - got[0]["at"]) / 1000) for r in got]
            per_second = [seconds_in.count(s) for s in range(seconds_in[-1] + 1)]
            applies.append(apply_ms)
            frames.append(frame_ms)
            rates.append(max(per_second))
            each = ", ".join(f"{r['apply_ms']:.0f}" for r in got)
            print(
                f"second {k}: {len(got)} messages ({', '.join(r['type'] for r in got)}) of "
                f"{sum(r['nodes'] for r in got):,} nodes, {sum(r['bytes'] for r in got) / 1e6:.1f} "
                f"MB; apply {apply_ms:.0f} ms (each: {each}), to the frame after "
                f"{frame_ms:.0f} ms; every node drawn {drawn:.2f} s after the first change; "
                f"messages in each second: {per_second}"
            )
        print(
            f"\none second's deltas for {len(ids):,} nodes: apply median "
            f"{statistics.median(applies):.0f} ms, with the frames {statistics.median(frames):.0f}"
            f" ms; messages a second the browser got: at most {max(rates)} ({bound})"
        )
        if errors:
            print(f"page errors: {errors}")
        browser.close()


if __name__ == "__main__":
    main()
