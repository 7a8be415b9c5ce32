"""The end-to-end test's job launcher, standing in for `srun` on a multi-node allocation:

    python e2e_launch.py --ranks 4 --default-nodes node-01,node-02 --log LOG -- TRAIN_ARGS…

starts one torchrun agent per node named in OPSBOARD_NODES (as `opsboard-agent supervise`
sets it on a resume; --default-nodes on the first start), each with OPSBOARD_NODE set to
its node so that its ranks report from there, splitting --ranks evenly over the nodes
(static rendezvous on loopback: every "node" is this host). Each rank's
examples/ddp_train.py gets TRAIN_ARGS and a spool directory of its node.

Appends one JSON line per start to LOG (nodes, OPSBOARD_RESUME_FROM, pids), so the test
reads what the job was started with. SIGTERM (supervise's stop, sent to the whole process
group) reaches the torchrun agents directly; this process waits for them and exits with the
first non-zero status."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun_argv(nodes: list[str], index: int, per_node: int, port: int) -> list[str]:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(per_node)]
    if len(nodes) == 1:
        return [*argv, "--standalone"]
    return [
        *argv,
        *("--nnodes", str(len(nodes)), "--node-rank", str(index)),
        *("--master-addr", "127.0.0.1", "--master-port", str(port)),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--default-nodes", required=True)
    parser.add_argument("--spool-dir", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("train", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    train = args.train[1:] if args.train[:1] == ["--"] else args.train
    nodes = [n for n in (os.environ.get("OPSBOARD_NODES") or args.default_nodes).split(",") if n]
    if not nodes or args.ranks % len(nodes):
        print(f"cannot split {args.ranks} ranks over nodes {nodes}", file=sys.stderr)
        return 2
    # The agents get supervise's SIGTERM themselves (same process group): wait for them.
    # (A handler, not SIG_IGN: an ignored signal would stay ignored in the agents.)
    signal.signal(signal.SIGTERM, lambda *_: None)
    port, per_node = free_port(), args.ranks // len(nodes)
    agents = []
    for index, node in enumerate(nodes):
        # "--" ends torchrun's own options: its parser would take `--run` for `--run-path`.
        argv = torchrun_argv(nodes, index, per_node, port)
        argv += [str(REPO / "examples" / "ddp_train.py"), "--", *train]
        argv += ["--spool-dir", str(args.spool_dir / node)]
        env = {**os.environ, "OPSBOARD_NODE": node, "OMP_NUM_THREADS": "1"}
        agents.append(subprocess.Popen(argv, env=env))
    record = {
        "ts": time.time(),
        "pid": os.getpid(),
        "nodes": nodes,
        "resume_from": os.environ.get("OPSBOARD_RESUME_FROM"),
        "agents": [agent.pid for agent in agents],
    }
    with open(args.log, "a") as log:
        log.write(json.dumps(record) + "\n")
    codes = [agent.wait() for agent in agents]
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main())
