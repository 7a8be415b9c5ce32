"""docs/grafana/opsboard.json is importable JSON whose every metric a scrape serves (the
server's, and a running agent's)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.test import Client, override_settings
from prometheus_client import CollectorRegistry, generate_latest

from opsboard_agent.agent import Agent
from opsboard_agent.metrics import AgentCollector
from opsboard_agent.sender import Sender
from opsboard_agent.shipper import Shipper
from opsboard_agent.spool import Spool
from tests.metrics.scrape import AUTH, TOKEN, parse

pytestmark = [pytest.mark.django_db]

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "opsboard.json"
METRIC = re.compile(r"\bopsboard_[a-z0-9_]+")
SUFFIXES = ("_total", "_bucket", "_sum", "_count")


def served_names(tmp_path: Path) -> set[str]:
    with override_settings(METRICS_TOKEN=TOKEN):
        server = Client().get("/metrics", **AUTH).content.decode()
    spool = Spool(tmp_path / "spool", max_bytes=1 << 20)
    try:
        sender = Sender(spool, server="http://127.0.0.1:9", token="t")
        registry = CollectorRegistry(auto_describe=False)
        agent = Agent([], Shipper(spool=spool, sender=sender, node="n"))
        registry.register(AgentCollector(spool=spool, sender=sender, agent=agent))
        exposition = generate_latest(registry).decode()
    finally:
        spool.close()
    names: set[str] = set()
    for text in (server, exposition):
        samples, families = parse(text)
        names |= families | {name for name, _ in samples}
    return names


def test_the_dashboard_uses_only_metrics_a_scrape_serves(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["panels"]
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in METRIC.findall(target["expr"])
    }
    assert len(used) >= 20
    served = served_names(tmp_path)
    missing = set()
    for name in used:
        base = next((name.removesuffix(s) for s in SUFFIXES if name.endswith(s)), name)
        if name not in served and base not in served:
            missing.add(name)
    assert not missing, f"the dashboard names metrics no scrape serves: {sorted(missing)}"
