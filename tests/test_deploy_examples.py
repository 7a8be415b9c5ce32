"""The deployment examples in deploy/ are checked by the tools that run them: the systemd
units by `systemd-analyze verify` (their commands pointed at this checkout's venv), the
Kubernetes DaemonSet against the Kubernetes schema (kubernetes-validate, strict), and both
against what they start: every server process has a unit, every option they set exists."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import yaml

from opsboard_agent.cli import build_parser
from tests.peers import peer_binaries

REPO = Path(__file__).resolve().parent.parent
SYSTEMD = REPO / "deploy" / "systemd"
DAEMONSET = REPO / "deploy" / "kubernetes" / "agent-daemonset.yaml"
KUBERNETES_VERSION = "1.30.0"
# The processes of a deployment (README, "Running against external Postgres and Redis")
SERVER_UNITS = {"web", "ingest", "asgi", "worker", "periodic", "beat", "publisher"}


def test_the_systemd_units_verify(tmp_path):
    [binary] = peer_binaries("systemd-analyze", install="apt-get install systemd")
    venv = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv"))
    units = sorted(SYSTEMD.iterdir())
    for unit in units:
        text = unit.read_text()
        # the units name an install under /opt; here their commands are this checkout's
        text = text.replace("/opt/opsboard-agent/bin", str(venv / "bin"))
        text = text.replace("/opt/opsboard/.venv", str(venv)).replace("/opt/opsboard", str(REPO))
        (tmp_path / unit.name).write_text(text)
    checked = subprocess.run(
        [binary, "verify", "--man=no", *(str(tmp_path / u.name) for u in units)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0 and not checked.stderr.strip(), checked.stderr
    names = {u.name.removeprefix("opsboard-").removesuffix(".service") for u in units}
    assert SERVER_UNITS | {"agent"} <= names
    for name in SERVER_UNITS:
        text = (SYSTEMD / f"opsboard-{name}.service").read_text()
        assert "Restart=always" in text and "WantedBy=opsboard.target" in text, name
    for name in ("ingest", "worker", "agent"):  # they yield the CPU (README)
        assert "CPUWeight=idle" in (SYSTEMD / f"opsboard-{name}.service").read_text(), name


def test_the_agent_unit_passes_options_the_agent_has():
    text = (SYSTEMD / "opsboard-agent.service").read_text()
    [command] = re.findall(r"^ExecStart=\S+/opsboard-agent (.*)$", text, re.MULTILINE)
    arguments = command.replace("${STATE_DIRECTORY}", "/var/lib/opsboard-agent").split()
    assert build_parser().parse_args(arguments).command == "run"


def test_the_daemonset_is_valid_and_configures_the_agent_it_runs():
    import kubernetes_validate

    [daemonset] = list(yaml.safe_load_all(DAEMONSET.read_text()))
    kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)
    containers = {c["name"]: c for c in daemonset["spec"]["template"]["spec"]["containers"]}
    agent = containers["agent"]
    assert agent["command"] == ["opsboard-agent", "run"]
    cli = (REPO / "opsboard_agent" / "cli.py").read_text()
    for variable in agent["env"]:
        assert f'"{variable["name"]}"' in cli, f"the agent reads no {variable['name']}"
    scrape = next(v["value"] for v in agent["env"] if v["name"] == "OPSBOARD_SCRAPE")
    port = containers["dcgm-exporter"]["args"][-1].rsplit(":", 1)[1]
    assert scrape.endswith(f":{port}/metrics")  # the agent scrapes the exporter beside it
