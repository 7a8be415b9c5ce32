"""Prometheus / OpenMetrics scrapes (dcgm-exporter, node_exporter, anything else).

DCGM fields become the contract's core GPU metrics (see dcgm.py); every other series is kept
under its own name, sanitised to the contract's pattern, with its distinguishing labels
folded into the name (`node_cpu_seconds_total.cpu_0.mode_idle`) because a contract sample
has no labels. An exposition that does not parse is rejected whole (logged, counted): half
a scrape would be indistinguishable from a real change."""

from __future__ import annotations

import logging
import math
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families

from opsboard_agent.collectors import Collector, dcgm
from opsboard_agent.collectors.events import ErrorEvents
from opsboard_agent.records import Event, Sample, sample, sanitize_metric

log = logging.getLogger(__name__)

ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
DROPPED_LABELS = frozenset({"job", "instance"})
_COUNTER_TYPE = re.compile(r"^[ \t]*#[ \t]+TYPE[ \t]+(\S+)[ \t]+counter[ \t]*$", re.MULTILINE)


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


def families_to_records(
    families: Iterable[Any], now: float, errors: ErrorEvents, source: str = ""
) -> tuple[list[Sample], list[Event]]:
    """Contract samples and events for parsed families, all stamped `now`.

    Exposed timestamps are ignored on purpose: a textfile written days ago would put the
    whole batch outside the server's 7-day window (a 400 stores nothing of it)."""
    samples: list[Sample] = []
    events: list[Event] = []
    framebuffer: dict[int, dict[str, float]] = {}
    has_total: set[int] = set()
    for family in families:
        if family.type == "info":
            continue
        is_dcgm = dcgm.is_dcgm_family(family.name)
        for s in family.samples:
            if s.name.endswith("_created") and family.type != "gauge":
                continue  # OpenMetrics creation times: metadata, not telemetry
            value = float(s.value)
            if not math.isfinite(value) or (is_dcgm and dcgm.is_blank(value)):
                continue
            labels = {k: v for k, v in s.labels.items() if v != "" and k not in DROPPED_LABELS}
            gpu = _gpu_index(labels.get("gpu"))
            if is_dcgm:
                if gpu is not None and not labels.keys() & dcgm.MIG_LABELS:
                    if s.name in dcgm.XID_FIELDS:
                        if event := errors.last_xid((source, gpu), now, gpu, value):
                            events.append(event)
                        continue
                    if s.name in dcgm.FB_PARTS:
                        framebuffer.setdefault(gpu, {})[dcgm.FB_PARTS[s.name]] = value
                    if s.name in dcgm.CORE_FIELDS:
                        metric, factor = dcgm.CORE_FIELDS[s.name]
                        if metric == "gpu.mem_total_bytes":
                            has_total.add(gpu)
                        if record := sample(now, metric, value * factor, gpu):
                            samples.append(record)
                        if metric in dcgm.ECC_KIND and (
                            event := errors.ecc(
                                (source, gpu, metric), now, gpu, value, dcgm.ECC_KIND[metric]
                            )
                        ):
                            events.append(event)
                        continue
                labels = {
                    k: v
                    for k, v in labels.items()
                    if k not in dcgm.IDENTITY_LABELS and not k.startswith("DCGM_FI_")
                }
            elif gpu is not None:
                labels.pop("gpu")
            if record := sample(now, _folded_name(s.name, labels), value, gpu):
                samples.append(record)
    for gpu, parts in framebuffer.items():
        if gpu not in has_total and "free" in parts and "used" in parts:
            total = sum(parts.values()) * dcgm.MIB
            if record := sample(now, "gpu.mem_total_bytes", total, gpu):
                samples.append(record)
    return samples, events


def _gpu_index(label: str | None) -> int | None:
    return int(label) if label is not None and label.isdigit() else None


def _folded_name(name: str, labels: dict[str, str]) -> str:
    suffix = "".join(f".{key}_{labels[key]}" for key in sorted(labels))
    return sanitize_metric(name + suffix)


class ScrapeCollector(Collector):
    """Scrapes each URL at every collect; a failed URL (down, timeout, not exposition)
    contributes nothing this time and counts in `errors`."""

    name = "scrape"

    def __init__(self, urls: list[str], timeout: float = 5.0) -> None:
        self.urls = list(urls)
        self.timeout = timeout
        self.errors = 0
        self._events: list[Event] = []
        self._error_events = ErrorEvents()
        self._failing: set[str] = set()
        # Exporters are local; a proxy from the environment must not capture them.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def fetch(self, url: str) -> tuple[str, str]:
        """(body, content type) of one scrape; raises OSError/ValueError on failure."""
        request = urllib.request.Request(url, headers={"Accept": ACCEPT})
        with self._opener.open(request, timeout=self.timeout) as response:
            body = response.read()
            content_type = response.headers.get("Content-Type", "")
        return body.decode("utf-8", errors="replace"), content_type

    def collect(self, now: float) -> list[Sample]:
        samples: list[Sample] = []
        for url in self.urls:
            started = time.monotonic()
            try:
                text, content_type = self.fetch(url)
                families = parse_exposition(text, content_type)
            except (OSError, ValueError, urllib.error.URLError) as exc:
                self.errors += 1
                # One warning when a URL starts failing, then quiet until it recovers.
                level = logging.DEBUG if url in self._failing else logging.WARNING
                log.log(level, "scrape of %s failed: %s", url, exc)
                self._failing.add(url)
                continue
            if url in self._failing:
                log.info("scrape of %s works again", url)
                self._failing.discard(url)
            new_samples, events = families_to_records(families, now, self._error_events, url)
            samples.extend(new_samples)
            self._events.extend(events)
            log.debug(
                "scraped %s: %d samples in %.3f s",
                url,
                len(new_samples),
                time.monotonic() - started,
            )
        return samples

    def take_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events
