"""Prometheus / OpenMetrics scrapes (dcgm-exporter, node_exporter, anything else).

DCGM fields become the contract's core GPU metrics (see dcgm.py); every other series is kept
as `<target>:<name with its labels folded in>` (series.py), counters as per-second rates.
An exposition that does not parse is rejected whole (logged, counted): half a scrape would
be indistinguishable from a real change. Text-format scrapes take the fast path of
layout.py once their lines are known."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import math
import operator
import re
import time
from dataclasses import dataclass, field
from itertools import compress, repeat
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families

from opsboard_agent.collectors import Collector, dcgm
from opsboard_agent.collectors.events import ErrorEvents
from opsboard_agent.collectors.layout import (
    Emission,
    Layout,
    NoFastPath,
    build_layout,
    compile_plans,
)
from opsboard_agent.collectors.series import RATE, XID, Plan, plans_for_samples
from opsboard_agent.rates import counter_rates
from opsboard_agent.records import EncodedSamples, Event, Sample, sample
from opsboard_agent.targets import ScrapeTarget, parse_targets

log = logging.getLogger(__name__)

# The text format first: the fast path reads it (OpenMetrics adds nothing the agent keeps:
# `_created` and exemplars are dropped), and OpenMetrics stays acceptable.
ACCEPT = "text/plain;version=0.0.4,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
_COUNTER_TYPE = re.compile(r"^[ \t]*#[ \t]+TYPE[ \t]+(\S+)[ \t]+counter[ \t]*$", re.MULTILINE)


# The server's bound on a value (apps/core/bounds.py): one beyond it would cost the batch.
VALUE_MAX = 1e150


class ExpositionError(ValueError):
    """The scraped text is not valid exposition."""


def parse_exposition(text: str, content_type: str = "") -> list[Any]:
    """Metric families of a scrape, by the format its Content-Type names.

    OpenMetrics is held to the 1.0 rules as the official conformance suite states them. One
    consequence: a histogram with negative bucket bounds *and* a `_sum` is rejected
    (suite case bad_histograms_3), although Prometheus itself accepts it.

    Raises ExpositionError for anything the parser rejects (the parsers raise a mix of
    exception types on bad input, so all are caught here and re-raised as one)."""
    try:
        if "application/openmetrics-text" in content_type:
            return list(openmetrics_families(text))
        return _unmunge_counters(list(text_families(text)), text)
    except Exception as exc:
        raise ExpositionError(str(exc) or type(exc).__name__) from exc


def _unmunge_counters(families: list[Any], text: str) -> list[Any]:
    """Give counters of the text format back the sample names they were exposed under.

    prometheus_client's text parser renames the samples of a counter declared without the
    `_total` suffix (`DCGM_FI_DEV_ECC_DBE_VOL_TOTAL` → `..._TOTAL_total`) to fit the
    OpenMetrics model; the contract stores names as the exporter sent them."""
    declared = set(_COUNTER_TYPE.findall(text))
    for family in families:
        if family.type == "counter" and family.name in declared:
            family.samples = [
                s._replace(name=s.name[: -len("_total")]) if s.name == family.name + "_total" else s
                for s in family.samples
            ]
    return families


@dataclass
class Scraped:
    """One scrape's samples as JSON text (objects separated by commas, ready to splice into
    a batch's `samples`), how many, and its events."""

    json: str = ""
    count: int = 0
    events: list[Event] = field(default_factory=list)

    def samples(self) -> list[Sample]:
        return json.loads(f"[{self.json}]")


class TargetReader:
    """Turns one target's expositions into samples and events, scrape after scrape (it
    keeps the text layout, the counters' previous values and the DCGM error state).

    Counters become per-second rates over the time since the previous scrape: none on the
    first scrape (no interval yet), and none for a counter that went down (the exporter
    restarted: its counters start again from zero) -- never a negative rate or a spike."""

    def __init__(self, target: ScrapeTarget, errors: ErrorEvents | None = None) -> None:
        self.target = target
        self.errors = errors or ErrorEvents()
        self.layout: Layout | None = None
        self.slow_parses = 0
        self._previous_heads: list[str] = []
        self._previous_values: list[float] = []
        self._previous_ts: float | None = None
        self._dcgm_previous: dict[tuple[str, int | None], float] = {}

    def read(self, text: str, content_type: str, now: float) -> Scraped:
        """The samples and events of one scrape stamped `now`; raises ExpositionError
        (nothing read) when the exposition does not parse.

        Exposed timestamps are ignored on purpose: a textfile written days ago would put
        the whole batch outside the server's 7-day window (a 400 stores nothing of it)."""
        openmetrics = "application/openmetrics-text" in content_type
        values = None if openmetrics or self.layout is None else self.layout.values(text)
        if values is None:
            self.slow_parses += 1
            families = parse_exposition(text, content_type)
            self.layout = None
            if not openmetrics:
                with contextlib.suppress(NoFastPath):  # then every scrape is parsed whole
                    self.layout = build_layout(text, families, self.target)
            if self.layout is not None:
                values = self.layout.values(text)
            if values is None:  # OpenMetrics, or text the fast path cannot take
                pairs = [(family, s) for family in families for s in family.samples]
                plans, duplicates = plans_for_samples(pairs, self.target)
                emission = compile_plans(plans, duplicates)
                values = [float(s.value) for _, s in pairs]
            else:  # values came from the layout, so there is one
                emission = self.layout.emission  # type: ignore[union-attr]
            if emission.duplicates:
                log.info("%s: %d duplicate series dropped", self.target.name, emission.duplicates)
        else:
            emission = self.layout.emission  # type: ignore[union-attr]
        return self._emit(emission, values, now)

    def _emit(self, emission: Emission, values: list[float], now: float) -> Scraped:
        at = values.__getitem__
        gauges = list(map(at, emission.gauge_pos))
        # |v| <= 1e150 is False for NaN and ±Inf too: one test keeps what the server takes.
        keep = map(VALUE_MAX.__ge__, map(abs, gauges))
        parts = list(compress(map(operator.add, emission.gauge_json, map(repr, gauges)), keep))
        before, self._previous_ts = self._previous_ts, now
        parts += self._rates(emission.rate_json, list(map(at, emission.rate_pos)), before, now)
        tail = f',"ts":{now!r}}}'
        text = (tail + ",").join(parts) + tail if parts else ""
        other, events = self._emit_other(emission.other, values, before, now)
        if other:
            text = ",".join(filter(None, (text, json.dumps(other, separators=(",", ":"))[1:-1])))
        return Scraped(text, len(parts) + len(other), events)

    def _rates(
        self, heads: list[str], current: list[float], before: float | None, now: float
    ) -> list[str]:
        """JSON heads + rates of the counters since the previous scrape (see the class): the
        rule of rates.counter_rates, run as C loops over the whole layout."""
        if heads is self._previous_heads:  # the same layout: the lists line up
            previous = self._previous_values
        else:
            known = dict(zip(self._previous_heads, self._previous_values, strict=True))
            previous = list(map(known.get, heads, repeat(math.nan, len(heads))))
        self._previous_heads, self._previous_values = heads, current
        if before is None or now <= before:
            return []
        deltas = list(map(operator.sub, current, previous))
        rates = list(map((1.0 / (now - before)).__mul__, deltas))
        keep = map(operator.and_, map((0.0).__le__, deltas), map(VALUE_MAX.__ge__, map(abs, rates)))
        return list(compress(map(operator.add, heads, map(repr, rates)), keep))

    def _emit_other(
        self, other: list[tuple[int, Plan]], values: list[float], before: float | None, now: float
    ) -> tuple[list[Sample], list[Event]]:
        """DCGM series: blank sentinels dropped, core metrics, XID/ECC events, and the
        framebuffer total derived from its parts when the exporter has no total."""
        samples: list[Sample] = []
        events: list[Event] = []
        framebuffer: dict[int, dict[str, float]] = {}
        has_total: set[int] = set()
        counters: dict[tuple[str, int | None], float] = {}
        source = self.target.name
        for pos, plan in other:
            value, gpu = values[pos], plan.gpu
            if not math.isfinite(value) or (plan.dcgm and dcgm.is_blank(value)):
                continue
            if plan.fb is not None and gpu is not None:
                framebuffer.setdefault(gpu, {})[plan.fb] = value
            if plan.kind is XID and gpu is not None:
                if event := self.errors.last_xid((source, gpu), now, gpu, value):
                    events.append(event)
                continue
            if plan.kind is RATE:  # a DCGM counter of its own (energy, PCIe replays)
                counters[(plan.metric, gpu)] = value
                continue
            if plan.metric == "gpu.mem_total_bytes" and gpu is not None:
                has_total.add(gpu)
            if record := sample(now, plan.metric, value * plan.factor, gpu):
                samples.append(record)
            if plan.ecc and gpu is not None:
                key = (source, gpu, plan.metric)
                if event := self.errors.ecc(key, now, gpu, value, plan.ecc):
                    events.append(event)
        if before is not None:
            for (metric, gpu), rate in counter_rates(
                self._dcgm_previous, before, counters, now
            ).items():
                if record := sample(now, metric, rate, gpu):
                    samples.append(record)
        self._dcgm_previous = counters
        for gpu, parts in framebuffer.items():
            if gpu not in has_total and "free" in parts and "used" in parts:
                total = sum(parts.values()) * dcgm.MIB
                if record := sample(now, "gpu.mem_total_bytes", total, gpu):
                    samples.append(record)
        return samples, events


class ScrapeCollector(Collector):
    """Scrapes each target at every collect; a failed target (down, timeout, not
    exposition) contributes nothing this time and counts in `errors`."""

    name = "scrape"

    def __init__(self, targets: list[ScrapeTarget] | list[str], timeout: float = 5.0) -> None:
        self.targets = [t for t in targets if isinstance(t, ScrapeTarget)] or parse_targets(
            [t for t in targets if isinstance(t, str)]
        )
        self.readers = [TargetReader(t) for t in self.targets]
        self.timeout = timeout
        self.errors = 0
        self._events: list[Event] = []
        self._failing: set[str] = set()
        # One kept-alive connection per target: a new connection and urllib's machinery
        # each second cost more CPU than reading the values. Exporters are local; no proxy.
        self._connections: dict[str, http.client.HTTPConnection] = {}

    def fetch(self, url: str) -> tuple[str, str]:
        """(body, content type) of one scrape; raises OSError/ValueError on failure."""
        parts = urlsplit(url)
        connection = self._connections.get(url)
        if connection is None:
            kind = (
                http.client.HTTPSConnection
                if parts.scheme == "https"
                else http.client.HTTPConnection
            )
            connection = self._connections[url] = kind(parts.netloc, timeout=self.timeout)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        try:
            connection.request("GET", path, headers={"Accept": ACCEPT})
            response = connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()  # reconnects at the next scrape
            raise OSError(f"{type(exc).__name__}: {exc}") from exc
        if response.status != 200:
            raise OSError(f"HTTP {response.status} {response.reason}")
        return body.decode("utf-8", errors="replace"), response.getheader("Content-Type", "")

    def collect(self, now: float) -> list[Sample]:
        """As `collect_encoded`, decoded (for tools and tests; the agent ships the JSON)."""
        samples, encoded = self.collect_encoded(now)
        for chunk in encoded:
            samples.extend(json.loads(f"[{chunk.text}]"))
        return samples

    def collect_encoded(self, now: float) -> tuple[list[Sample], list[EncodedSamples]]:
        encoded: list[EncodedSamples] = []
        for reader in self.readers:
            name, url = reader.target.name, reader.target.url
            started = time.monotonic()
            try:
                text, content_type = self.fetch(url)
                scraped = reader.read(text, content_type, now)
            except (OSError, ValueError) as exc:
                self.errors += 1
                # One warning when a target starts failing, then quiet until it recovers.
                level = logging.DEBUG if name in self._failing else logging.WARNING
                log.log(level, "scrape of %s (%s) failed: %s", name, url, exc)
                self._failing.add(name)
                continue
            if name in self._failing:
                log.info("scrape of %s (%s) works again", name, url)
                self._failing.discard(name)
            if scraped.count:
                encoded.append(EncodedSamples(scraped.json, scraped.count))
            self._events.extend(scraped.events)
            log.debug(
                "scraped %s: %d samples in %.3f s", name, scraped.count, time.monotonic() - started
            )
        return [], encoded

    def take_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()
