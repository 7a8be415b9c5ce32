"""The NVML collector on a machine without an NVIDIA driver (this one, and CI)."""

import logging
import threading
import time

import pytest

from opsboard_agent.agent import Agent
from opsboard_agent.collectors.gpu import GpuCollector
from opsboard_agent.collectors.host import HostCollector
from opsboard_agent.shipper import Shipper
from opsboard_agent.spool import Spool


@pytest.fixture
def no_driver():
    collector = GpuCollector()
    if collector.available:  # pragma: no cover - a GPU node runs the other branch
        collector.close()
        pytest.fail("this test is about a machine without an NVIDIA driver")
    return collector


def test_it_reports_itself_unavailable_once(caplog):
    with caplog.at_level(logging.INFO, logger="opsboard_agent"):
        collector = GpuCollector()
        assert not collector.available
        for _ in range(3):
            assert collector.collect(time.time()) == []
            assert collector.take_events() == []
    lines = [r for r in caplog.records if r.name.endswith("collectors.gpu")]
    assert len(lines) == 1 and "unavailable" in lines[0].getMessage()
    collector.close()


def test_the_agent_loop_runs_on_without_it(tmp_path, no_driver):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    shipper = Shipper(spool=spool, sender=None, node="node-01")
    agent = Agent([no_driver, HostCollector()], shipper, interval=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,))
    thread.start()
    time.sleep(0.4)
    stop.set()
    thread.join(5)
    assert agent.ticks >= 3 and agent.collector_errors == 0
    assert len(spool) == agent.ticks
    body = spool.oldest().body.decode()
    assert "host.cpu_util" in body and "gpu." not in body
