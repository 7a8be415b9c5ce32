"""The agent on a GPU node: installed on its own from `opsboard_agent/pyproject.toml` into a
fresh virtual environment (nothing of the server comes with it), then one scrape-and-ship
round against the live stack; and `--ca-file`: a server whose certificate only a private CA
vouches for is reached with that CA and refused without it."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from opsboard_agent import __version__
from opsboard_agent.sender import Sender
from opsboard_agent.spool import Spool
from tests.agent.conftest import FIXTURES, REPO, serve_file
from tests.agent.conftest import loopback as loopback  # a fixture, used by name
from tests.agent.test_real_exporters import start, stop

NODE = "standalone-node"


@pytest.fixture(scope="module")
def agent_venv(tmp_path_factory):
    """A new virtual environment with the agent's distribution installed, and nothing else."""
    venv = tmp_path_factory.mktemp("agent-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
    ]
    installed = subprocess.run([*pip, str(REPO / "opsboard_agent")], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return venv


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(240)
def test_the_agent_installs_alone_and_ships_a_scrape(
    agent_venv, live_stack, agent_token, loopback, tmp_path
):
    from apps.ingest.models import InboxBatch
    from launcher.procs import wait_until
    from tests.ingest.test_remote_write import stored

    python = str(agent_venv / "bin" / "python")
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True, check=True
    )
    names = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert {"opsboard-agent", "psutil", "prometheus-client", "nvidia-ml-py"} <= names
    assert not names & {"django", "celery", "plotly", "psycopg", "channels", "numpy"}, names
    agent = str(agent_venv / "bin" / "opsboard-agent")
    version = subprocess.run([agent, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"opsboard-agent {__version__}"
    helped = subprocess.run([agent, "run", "--help"], capture_output=True, text=True, check=True)
    assert "--ca-file" in helped.stdout and "--metrics-port" in helped.stdout

    text = "text/plain; version=0.0.4"
    loopback.routes["/metrics"] = serve_file(FIXTURES / "node_exporter" / "e2e-output.txt", text)
    token, secret = agent_token
    (tmp_path / "token").write_text(secret)
    command = [
        agent, "run", "--server", live_stack.url, "--token-file", str(tmp_path / "token"),
        "--node", NODE, "--no-gpu", "--interval", "1", "--scrape", f"node={loopback.url}/metrics",
        "--spool-dir", str(tmp_path / "spool"), "--log-level", "WARNING",
    ]  # fmt: skip
    # outside the checkout (no `opsboard_agent` to import from the working directory)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    process = start(command, tmp_path / "agent.log", env=env)
    try:
        wait_until(
            lambda: any(
                metric.startswith("node:node_") for _, metric, _ in stored(token.cluster_id)
            ),
            60,
            "the standalone agent's scrape stored",
        )
    finally:
        stop(process)
    log = (tmp_path / "agent.log").read_text()
    assert process.returncode == 0 and "Traceback" not in log, log
    assert InboxBatch.objects.filter(token=token).exists()


@pytest.fixture
def private_ca(tmp_path):
    """(certificate, key) of a self-signed certificate for 127.0.0.1: its own CA."""
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=opsboard-test",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],  # fmt: skip
        check=True,
        capture_output=True,
    )
    return cert, key


def test_the_ca_file_vouches_for_a_private_server(private_ca, tmp_path):
    cert, key = private_ca
    posted: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posted.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(202)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{server.server_address[1]}"
    try:
        untrusting = Sender(
            Spool(tmp_path / "a", max_bytes=1 << 20), server=url, token="t", timeout=5
        )
        untrusting.spool.put("b-1", b'{"batch_id": "b-1"}')
        assert untrusting.send_once() > 0  # a certificate no system CA signed: retried later
        assert posted == [] and len(untrusting.spool) == 1

        trusting = Sender(
            Spool(tmp_path / "b", max_bytes=1 << 20), server=url, token="t", ca_file=str(cert)
        )
        trusting.spool.put("b-2", b'{"batch_id": "b-2"}')
        assert trusting.send_once() == 0.0
        assert len(posted) == 1 and len(trusting.spool) == 0
    finally:
        server.shutdown()
        server.server_close()
