"""`opsboard-agent run`: the node agent as a command (also `python -m opsboard_agent`).
`opsboard-agent supervise -- CMD…` wraps a training command (opsboard_agent/supervise.py).

Every option has an environment variable (OPSBOARD_SERVER, OPSBOARD_TOKEN_FILE,
OPSBOARD_NODE, OPSBOARD_SCRAPE (space- or comma-separated), OPSBOARD_SCRAPE_BUCKETS
(space-separated), OPSBOARD_INTERVAL,
OPSBOARD_SPOOL_DIR, OPSBOARD_SPOOL_MAX_MB, OPSBOARD_LOG_LEVEL, OPSBOARD_NO_GPU,
OPSBOARD_SPOOL_JOURNAL, OPSBOARD_METRICS_PORT, OPSBOARD_METRICS_ADDR, OPSBOARD_CA_FILE); a
flag wins over its variable. The token is read from a file so it never shows in `ps`.
SIGTERM/SIGINT stop the loop; the buffer is spooled and the sender gets a few seconds to
deliver; whatever is left stays spooled for the next start.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socket
import sys
import threading
from pathlib import Path

import psutil

from opsboard_agent import __version__, supervise
from opsboard_agent.agent import Agent
from opsboard_agent.collectors import Collector
from opsboard_agent.collectors.gpu import GpuCollector
from opsboard_agent.collectors.host import HostCollector
from opsboard_agent.collectors.scrape import ScrapeCollector
from opsboard_agent.records import sanitize_name
from opsboard_agent.sender import Sender
from opsboard_agent.shipper import Shipper
from opsboard_agent.spool import Spool, SpoolLocked
from opsboard_agent.targets import TargetError, parse_targets

log = logging.getLogger("opsboard_agent")

DEFAULT_SPOOL_DIR = Path.home() / ".local" / "state" / "opsboard-agent" / "spool"

RUN_EPILOG = """\
token: on the server, `python manage.py issue_token CLUSTER --name NAME` creates the cluster
if needed and prints a new agent token once; write it to a file only this user can read
(chmod 600) and pass that file as --token-file. One token serves every node of a cluster.

spool: every batch is written to --spool-dir before it is sent and leaves it once the
server has it, so nothing is lost while the server is away (at most --spool-max-mb, the
oldest dropped first). Default: %(spool)s

example:
  opsboard-agent run --server https://opsboard.example --token-file /etc/opsboard/token
"""


# node_info's extra fields, as the server bounds them (apps.core.bounds EXTRA_KEY_PATTERN)
_INFO_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")
_INFO_RESERVED = frozenset({"gpus", "gpu_model", "cpus", "mem_bytes"})


def _info_item(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not _INFO_KEY.match(key) or key in _INFO_RESERVED or len(value) > 1024:
        raise argparse.ArgumentTypeError(
            f"{text!r}: KEY=VALUE, KEY a letter then letters, digits, '_', '.' or '-' (not "
            f"{', '.join(sorted(_INFO_RESERVED))}), VALUE up to 1024 characters"
        )
    return key, value.replace("\x00", "")


MAX_BATCH_SECONDS = 60.0  # what is gathered lives in memory until it is spooled


def _batch_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_BATCH_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds from 0 to {MAX_BATCH_SECONDS:g}")
    return seconds


def _env_bool(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="opsboard-agent", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"opsboard-agent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="collect and ship telemetry until stopped",
        description="Collect this node's telemetry and ship it to an Opsboard server until "
        "stopped.",
        epilog=RUN_EPILOG % {"spool": DEFAULT_SPOOL_DIR},
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "--server",
        default=env("OPSBOARD_SERVER"),
        help="base URL of the Opsboard server, e.g. https://opsboard.example",
    )
    run.add_argument(
        "--ca-file",
        default=env("OPSBOARD_CA_FILE"),
        help="CA bundle (PEM) that the server's TLS certificate is verified against, for a "
        "private CA (default: the system's trust store)",
    )
    run.add_argument(
        "--token-file",
        default=env("OPSBOARD_TOKEN_FILE"),
        help="file holding the cluster's agent token (from `manage.py issue_token`, below)",
    )
    run.add_argument(
        "--node",
        default=env("OPSBOARD_NODE") or socket.gethostname(),
        help="this node's name (default: the host name)",
    )
    run.add_argument(
        "--info",
        action="append",
        metavar="KEY=VALUE",
        type=_info_item,
        default=[_info_item(item) for item in (env("OPSBOARD_INFO") or "").split()],
        help="a field of this node's node_info (repeatable), such as rack=r12: the overview "
        "of a large fleet groups nodes into blocks by it (OVERVIEW_BLOCK_FIELD)",
    )
    run.add_argument(
        "--scrape",
        action="append",
        metavar="[NAME=]URL",
        default=(env("OPSBOARD_SCRAPE") or "").replace(",", " ").split(),
        help="a Prometheus/OpenMetrics endpoint to scrape (repeatable); its series are stored "
        "as NAME:series (default NAME: node for port 9100, dcgm for 9400, process for 9256, "
        "else scrape_PORT)",
    )
    run.add_argument(
        "--scrape-buckets",
        action="append",
        metavar="NAME=FAMILY[,FAMILY...]",
        default=(env("OPSBOARD_SCRAPE_BUCKETS") or "").split(),
        help="histogram families of target NAME whose buckets are kept (NAME=* for all; "
        "buckets are dropped otherwise)",
    )
    run.add_argument(
        "--interval",
        type=float,
        default=float(env("OPSBOARD_INTERVAL", "10")),
        help="seconds between collections (default 10)",
    )
    run.add_argument(
        "--batch-seconds",
        type=_batch_seconds,
        default=env("OPSBOARD_BATCH_SECONDS", "10"),  # a string: argparse applies `type`
        help="gather the ticks of this many seconds into one batch, one POST (default 10: "
        "with the default --interval every tick is its own batch, at --interval 1 ten ticks "
        "are; 0: a batch a tick). Ticks not yet spooled are lost to a kill -9",
    )
    run.add_argument(
        "--spool-dir",
        type=Path,
        default=Path(env("OPSBOARD_SPOOL_DIR") or DEFAULT_SPOOL_DIR),
        help="where batches wait until the server has them (default: %(default)s)",
    )
    run.add_argument(
        "--spool-max-mb",
        type=float,
        default=float(env("OPSBOARD_SPOOL_MAX_MB", "256")),
        help="the spool's size cap; the oldest batches go first (default: %(default)s)",
    )
    run.add_argument(
        "--no-gpu",
        action="store_true",
        default=_env_bool("OPSBOARD_NO_GPU"),
        help="do not load NVML (GPU metrics from a dcgm-exporter scrape instead)",
    )
    run.add_argument(
        "--spool-journal",
        action="store_true",
        default=_env_bool("OPSBOARD_SPOOL_JOURNAL"),
        help="append every spooled batch_id to <spool-dir>/journal (auditing)",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=int(env("OPSBOARD_METRICS_PORT") or 0) or None,
        help="serve the agent's own Prometheus metrics on this port (default: none)",
    )
    run.add_argument(
        "--metrics-addr",
        default=env("OPSBOARD_METRICS_ADDR", "127.0.0.1"),
        help="the address --metrics-port binds (default: %(default)s)",
    )
    run.add_argument("--log-level", default=env("OPSBOARD_LOG_LEVEL", "INFO"))
    supervise.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "supervise":
        return supervise.main(args)
    if not args.server or not args.token_file:
        log.error(
            "--server and --token-file (or OPSBOARD_SERVER, OPSBOARD_TOKEN_FILE) are required"
        )
        return 2
    try:
        token = Path(args.token_file).read_text().strip()
    except OSError as exc:
        log.error("cannot read the token file: %s", exc)
        return 2
    try:
        targets = parse_targets(args.scrape, args.scrape_buckets)
    except TargetError as exc:
        log.error("%s", exc)
        return 2
    try:
        spool = Spool(
            args.spool_dir,
            max_bytes=int(args.spool_max_mb * 1024 * 1024),
            journal=args.spool_journal,
        )
    except SpoolLocked as exc:
        log.error("%s", exc)
        return 1
    collectors: list[Collector] = [HostCollector()]
    gpu = None if args.no_gpu else GpuCollector()
    if gpu is not None and gpu.available:
        collectors.append(gpu)
    if targets:
        collectors.append(ScrapeCollector(targets, timeout=min(5.0, args.interval)))
    node_info: dict[str, int | str] = {
        "cpus": psutil.cpu_count() or 0,
        "mem_bytes": psutil.virtual_memory().total,
    }
    node_info.update(dict(args.info))
    if gpu is not None and gpu.available:
        node_info["gpus"] = gpu.gpu_count
        if gpu.gpu_model:
            node_info["gpu_model"] = gpu.gpu_model
    node = sanitize_name(args.node)
    sender = Sender(spool, server=args.server, token=token, ca_file=args.ca_file)
    shipper = Shipper(spool=spool, sender=sender, node=node, node_info=node_info).start()
    agent = Agent(collectors, shipper, interval=args.interval, batch_seconds=args.batch_seconds)
    metrics_server = None
    if args.metrics_port:
        from opsboard_agent.metrics import metrics_serve  # its HTTP server: only when asked

        try:
            metrics_server, _ = metrics_serve(
                port=args.metrics_port,
                addr=args.metrics_addr,
                spool=spool,
                sender=sender,
                agent=agent,
            )
        except OSError as exc:
            log.error(
                "cannot serve metrics on %s:%d: %s", args.metrics_addr, args.metrics_port, exc
            )
            shipper.close(drain_timeout=0.0)
            return 2
        log.info("metrics on http://%s:%d/metrics", args.metrics_addr, args.metrics_port)

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # Only the collectors that run: one that found no source already said so.
    log.info(
        "opsboard-agent: node %s → %s every %.1f s, a batch every %.1f s (spool %s, "
        "%d collectors: %s)",
        node,
        args.server,
        args.interval,
        max(args.interval, args.batch_seconds),
        args.spool_dir,
        len(collectors),
        ", ".join(c.name for c in collectors),
    )
    for target in targets:
        log.info("scrape target %s: %s", target.name, target.url)
    try:
        agent.run(stop)
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
        shipper.close(drain_timeout=5.0)
        for collector in collectors:
            collector.close()
        log.info("stopped after %d ticks; %d batches left in the spool", agent.ticks, len(spool))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
