"""The node agent gathers its ticks into one batch every `batch_seconds` (docs/agent.md,
"Ticks per batch"): what each batch holds, tick by tick."""

from __future__ import annotations

import json

import pytest

from opsboard_agent.agent import Agent
from opsboard_agent.collectors.host import HostCollector
from opsboard_agent.shipper import Shipper
from opsboard_agent.spool import Spool

T0 = 1_790_000_000.0


def spooled(spool: Spool) -> list[dict]:
    """The batches in the spool, oldest first."""
    return [json.loads(path.read_bytes()) for path in sorted(spool.directory.glob("*.batch"))]


def tick_times(batch: dict) -> list[float]:
    """The collect times of the ticks a batch holds: one agent.collector_errors a tick."""
    return [s["ts"] for s in batch["samples"] if s["metric"] == "agent.collector_errors"]


@pytest.fixture
def spool(tmp_path):
    spool = Spool(tmp_path / "spool", max_bytes=1 << 26)
    yield spool
    spool.close()  # a second close is harmless


def test_a_node_at_1_hz_posts_ten_ticks_a_batch_and_its_first_tick_alone(spool):
    agent = Agent([HostCollector()], Shipper(spool=spool, sender=None, node="n1"), 1.0, 10.0)
    # ticks drift by a few ms either way; the 10th after a batch completes the next one
    times = [T0 + i + (0.004 if i % 2 else -0.004) for i in range(31)]
    spooled_at = [i for i, now in enumerate(times) if agent.tick(now)]
    assert spooled_at == [0, 10, 20, 30]
    batches = spooled(spool)
    assert [tick_times(b) for b in batches] == [
        times[:1],
        times[1:11],
        times[11:21],
        times[21:31],
    ]
    # every host series of a batch carries every tick of it (after the first, for rates)
    cpu = [[s["ts"] for s in b["samples"] if s["metric"] == "host.cpu_util"] for b in batches]
    assert [len(ts) for ts in cpu[1:]] == [10, 10, 10]
    assert agent.shipper.pending() == 0


def test_a_late_tick_completes_its_batch_and_batch_seconds_0_posts_each_tick(spool):
    shipper = Shipper(spool=spool, sender=None, node="n1")
    agent = Agent([HostCollector()], shipper, interval=1.0, batch_seconds=10.0)
    # skipped ticks (a slow scrape): the one 9.6 s after the last batch is within half an
    # interval of due, the one at 9.4 s is not
    assert [bool(agent.tick(T0 + t)) for t in (0, 1, 5, 9.4, 9.6, 19.0, 19.2)] == [
        True, False, False, False, True, False, True,
    ]  # fmt: skip
    assert shipper.pending() == 0
    each = Agent([HostCollector()], shipper, interval=1.0, batch_seconds=0.0)
    assert all(each.tick(T0 + 30 + i) for i in range(3))
    assert [len(tick_times(b)) for b in spooled(spool)] == [1, 4, 2, 1, 1, 1]


def test_what_is_gathered_is_spooled_when_the_agent_stops(spool):
    shipper = Shipper(spool=spool, sender=None, node="n1")
    agent = Agent([HostCollector()], shipper, interval=1.0, batch_seconds=10.0)
    for i in range(4):
        agent.tick(T0 + i)
    assert shipper.pending() > 0 and len(spool) == 1
    shipper.close(drain_timeout=0)  # closes the spool too; its files stay
    assert [tick_times(b) for b in spooled(spool)] == [
        [T0],
        [T0 + 1, T0 + 2, T0 + 3],
    ]
