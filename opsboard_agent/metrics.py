"""The agent's own /metrics (`opsboard-agent run --metrics-port N`): spool depth and bytes,
batches dropped, sent, duplicate, rejected, retries, collector errors.

Read from the live objects at scrape time (a custom collector), served by prometheus_client's
own HTTP server in a daemon thread, bound to 127.0.0.1 unless --metrics-addr says otherwise:
a node exporter's port, not a public one.
"""

from __future__ import annotations

from collections.abc import Iterator
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from opsboard_agent.agent import Agent
from opsboard_agent.sender import Sender
from opsboard_agent.spool import Spool


class AgentCollector(Collector):
    def __init__(self, *, spool: Spool, sender: Sender, agent: Agent) -> None:
        self.spool, self.sender, self.agent = spool, sender, agent

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "opsboard_agent_spool_batches", "Batches waiting in the spool", value=len(self.spool)
        )
        yield GaugeMetricFamily(
            "opsboard_agent_spool_bytes", "Bytes waiting in the spool", value=self.spool.size_bytes
        )
        yield CounterMetricFamily(
            "opsboard_agent_spool_dropped_batches",
            "Batches dropped: the spool at its cap (oldest first) or an unreadable file",
            value=self.spool.dropped,
        )
        stats = self.sender.stats
        sent = CounterMetricFamily(
            "opsboard_agent_batches_sent",
            "Batches the server answered: delivered (202), duplicate (200), rejected (dropped)",
            labels=["outcome"],
        )
        sent.add_metric(["delivered"], stats.delivered)
        sent.add_metric(["duplicate"], stats.duplicates)
        sent.add_metric(["rejected"], stats.rejected)
        yield sent
        yield CounterMetricFamily(
            "opsboard_agent_send_attempts", "POSTs of a batch tried", value=stats.attempts
        )
        yield CounterMetricFamily(
            "opsboard_agent_send_retries",
            "Sends to be tried again: a network error, 429/503 or another status",
            value=stats.retries,
        )
        yield CounterMetricFamily(
            "opsboard_agent_ticks", "Collection ticks run", value=self.agent.ticks
        )
        yield GaugeMetricFamily(
            "opsboard_agent_gathered_records",
            "Records collected and not yet spooled (ticks gathered for the next batch)",
            value=self.agent.shipper.pending(),
        )
        yield CounterMetricFamily(
            "opsboard_agent_collector_errors",
            "Collections that raised",
            value=self.agent.collector_errors,
        )


def metrics_serve(
    *, port: int, addr: str, spool: Spool, sender: Sender, agent: Agent
) -> tuple[WSGIServer, Thread]:
    """Serve the agent's metrics on addr:port (port 0: any free one; the server's
    `server_address` says which) from a daemon thread; `shutdown()` stops it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(spool=spool, sender=sender, agent=agent))
    return start_http_server(port, addr=addr, registry=registry)
