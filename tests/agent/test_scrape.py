"""Prometheus / OpenMetrics scraping and the DCGM mapping, on the real-world tests/fixtures."""

import json
import math
import time

import pytest

from opsboard_agent.collectors import dcgm
from opsboard_agent.collectors.events import ErrorEvents
from opsboard_agent.collectors.scrape import (
    ExpositionError,
    ScrapeCollector,
    TargetReader,
    parse_exposition,
)
from opsboard_agent.records import METRIC_MAX_LEN, METRIC_RE
from opsboard_agent.targets import ScrapeTarget
from tests.agent.conftest import FIXTURES, closed_port_url, serve_file

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT = "text/plain; version=0.0.4; charset=utf-8"

# Valid text-format exposition among the fixtures (see tests/fixtures/README.md). Left out:
# the dcgm-exporter README excerpts (their "..." elision lines) and node_exporter's
# deliberately non-matching *.txt files.
TEXT_FILES = sorted(
    [
        *FIXTURES.glob("datadog-integrations-core/*.txt"),
        FIXTURES / "node_exporter" / "e2e-output.txt",
        *FIXTURES.glob("node_exporter/textfile/**/*.prom"),
        *FIXTURES.glob("node_exporter/textfile/*.out"),
        FIXTURES / "prometheus" / "alltypes.237mfs.prom.txt",
        FIXTURES / "prometheus" / "metrics-test.prom",
        FIXTURES / "prometheus-common" / "text",
        FIXTURES / "prometheus-common" / "fuzz-corpus" / "minimal",
        *FIXTURES.glob("prometheus-common/fuzz-corpus/from_test_parse_[0-9]"),
    ]
)
OM_CASES = sorted(p for p in (FIXTURES / "openmetrics" / "parsers").iterdir() if p.is_dir())


def records(text, content_type=TEXT, errors=None, reader=None, now=1_000.0):
    reader = reader or TargetReader(ScrapeTarget("test", "http://x"), errors or ErrorEvents())
    scraped = reader.read(text, content_type, now)
    return scraped.samples(), scraped.events


def assert_contract_samples(samples):
    for s in samples:
        assert METRIC_RE.match(s["metric"]) and len(s["metric"]) <= METRIC_MAX_LEN
        assert math.isfinite(s["value"])
        assert set(s) <= {"ts", "metric", "gpu", "value"}


def test_the_fixtures_are_there():
    assert len(TEXT_FILES) >= 30 and len(OM_CASES) == 211


@pytest.mark.parametrize("path", TEXT_FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_it_parses_every_valid_text_exposition(path):
    reader = TargetReader(ScrapeTarget("test", "http://x"))
    for now in (1_000.0, 1_001.0):  # the second scrape also has the counters' rates
        samples, _ = records(path.read_text(encoding="utf-8"), reader=reader, now=now)
        assert_contract_samples(samples)
        series = [(s["metric"], s.get("gpu")) for s in samples]
        assert len(series) == len(set(series))  # one value per series and timestamp


def test_it_parses_the_openmetrics_captures():
    text = (FIXTURES / "prometheus" / "1histogram.om.txt").read_text()
    reader = TargetReader(ScrapeTarget("test", "http://x"))
    records(text, OPENMETRICS, reader=reader)
    samples, _ = records(text, OPENMETRICS, reader=reader, now=1_001.0)  # rates from here
    assert samples and not any("_created" in s["metric"] for s in samples)
    assert_contract_samples(samples)


def test_it_holds_openmetrics_to_the_conformance_suite_on_negative_histogram_sums():
    # Prometheus accepts this capture, but OpenMetrics 1.0 forbids a _sum on a histogram
    # with negative buckets (suite case bad_histograms_3): rejected like that case.
    text = (FIXTURES / "prometheus" / "alltypes.5mfs.om.txt").read_text()
    with pytest.raises(ExpositionError, match="negative"):
        parse_exposition(text, OPENMETRICS)


@pytest.mark.parametrize("case", OM_CASES, ids=lambda p: p.name)
def test_it_agrees_with_the_openmetrics_suite(case):
    spec = json.loads((case / "test.json").read_text())
    text = (case / spec["file"]).read_bytes().decode("utf-8")
    if spec["shouldParse"]:
        samples, _ = records(text, OPENMETRICS)
        assert_contract_samples(samples)
    else:
        with pytest.raises(ExpositionError):
            parse_exposition(text, OPENMETRICS)


def test_it_maps_dcgm_fields_to_core_metrics():
    text = (FIXTURES / "datadog-integrations-core" / "metrics.txt").read_text()
    samples, events = records(text)
    core = {
        (s["metric"], s.get("gpu")): s["value"] for s in samples if s["metric"].startswith("gpu.")
    }
    assert core[("gpu.util", 0)] == 0
    assert core[("gpu.sm_clock_mhz", 0)] == 300
    assert core[("gpu.temp_c", 0)] == 25
    assert core[("gpu.power_w", 0)] == pytest.approx(8.969)
    assert core[("gpu.power_limit_w", 0)] == 70
    assert core[("gpu.mem_used_bytes", 0)] == 0
    assert core[("gpu.mem_total_bytes", 0)] == 15109 * 1024 * 1024  # MiB → bytes
    assert ("gpu.throttle_reasons", 0) in core
    names = {s["metric"] for s in samples}
    # Unmapped fields keep their own names, exactly as exposed (no `_total` added), under
    # the target's name; counters only as rates, from the second scrape on.
    assert "test:DCGM_FI_DEV_MEM_CLOCK" in names
    assert not any("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in name for name in names)
    assert not {name.partition(":")[2] for name in names} & set(dcgm.CORE_FIELDS)
    assert events == []  # XID gauge 0: no error
    assert_contract_samples(samples)


def test_it_never_emits_dcgm_blank_values():
    excerpt = (FIXTURES / "dcgm-exporter" / "README-quickstart-metrics-excerpt.txt").read_text()
    with pytest.raises(ExpositionError):
        parse_exposition(excerpt)  # the "..." elisions are not exposition
    text = "\n".join(line for line in excerpt.splitlines() if line != "...") + "\n"
    samples, _ = records(text)
    names = {s["metric"] for s in samples}
    assert "gpu.sm_clock_mhz" in names and "test:DCGM_FI_DEV_MEM_CLOCK" in names
    assert "test:DCGM_FI_DEV_MEMORY_TEMP" not in names
    for blank in ("9223372036854775794", "2147483632", "140737488355328"):
        line = f'DCGM_FI_DEV_FAN_SPEED{{gpu="0"}} {blank}\nDCGM_FI_DEV_GPU_TEMP{{gpu="0"}} 40\n'
        assert [s["metric"] for s in records(line)[0]] == ["gpu.temp_c"]


def test_it_never_emits_nan_or_infinity():
    text = "a NaN\nb +Inf\nc -Inf\nd 1\n"
    assert [s["metric"] for s in records(text)[0]] == ["test:d"]


def test_it_maps_every_field_of_the_dcgm_exporter_counter_lists():
    fields = set()
    for csv in FIXTURES.glob("dcgm-exporter/*.csv"):
        for line in csv.read_text().splitlines():
            line = line.strip().lstrip("#").strip()
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 3 and parts[1] in ("gauge", "counter"):
                fields.add(parts[0])
    assert len(fields) > 60
    text = "".join(f'{name}{{gpu="3",UUID="GPU-x",Hostname="h"}} 7\n' for name in sorted(fields))
    samples, _ = records(text)
    assert_contract_samples(samples)
    mapped = {s["metric"] for s in samples}
    # The core fields the lists carry come out under core names with the GPU index.
    for field in fields & set(dcgm.CORE_FIELDS):
        assert dcgm.CORE_FIELDS[field][0] in mapped
    assert all(s["gpu"] == 3 for s in samples)
    # And the mapping's own field names are real ones (no typos), bar the few that the
    # lists do not carry but dcgm-exporter exports when configured.
    not_in_lists = set(dcgm.CORE_FIELDS) - fields
    configurable = {
        "DCGM_FI_DEV_FB_TOTAL",
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
    }
    assert not_in_lists <= configurable | {
        f for f in dcgm.CORE_FIELDS if f.startswith("dcgm_") or "ECC" in f
    }


def test_it_turns_xid_and_ecc_fields_into_events():
    errors = ErrorEvents()
    text = (
        'DCGM_FI_DEV_XID_ERRORS{gpu="1"} 79\n'
        "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n"
        'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="1"} 0\n'
    )
    samples, events = records(text, errors=errors)
    assert events == [{"ts": 1_000.0, "kind": "xid", "gpu": 1, "code": 79}]
    assert [s["metric"] for s in samples] == ["gpu.ecc_uncorrected"]
    _, again = records(text.replace("} 0", "} 2"), errors=errors)
    assert again == [{"ts": 1_000.0, "kind": "ecc", "gpu": 1, "count": 2, "type": "uncorrected"}]


def test_it_folds_labels_into_names_for_other_exporters():
    text = 'node_cpu_scaling_frequency_hertz{cpu="0",governor="performance",job="node"} 5\n'
    assert [s["metric"] for s in records(text)[0]] == [
        "test:node_cpu_scaling_frequency_hertz.cpu_0.governor_performance"
    ]


def test_it_scrapes_urls_over_http(loopback):
    loopback.routes["/dcgm"] = serve_file(
        FIXTURES / "datadog-integrations-core" / "metrics.txt", TEXT
    )
    loopback.routes["/om"] = serve_file(FIXTURES / "prometheus" / "1histogram.om.txt", OPENMETRICS)
    collector = ScrapeCollector([loopback.url + "/dcgm", loopback.url + "/om"])
    collector.collect(time.time() - 1)
    samples = collector.collect(time.time())  # the histogram's _sum/_count are rates
    names = {s["metric"] for s in samples}
    port = loopback.url.rsplit(":", 1)[1]
    assert "gpu.util" in names
    histogram = f"scrape_{port}_2:golang_manual_histogram_seconds"
    assert any(n.startswith(histogram + "_count.") and n.endswith(".rate") for n in names)
    assert not any("_bucket" in n for n in names)  # not allow-listed
    assert collector.errors == 0
    assert "openmetrics" in loopback.requests[0].headers["Accept"]


def test_a_bad_scrape_is_rejected_and_counted_without_crashing(loopback):
    bad = OM_CASES[0]
    loopback.routes["/bad"] = serve_file(bad / "metrics", OPENMETRICS)
    loopback.routes["/good"] = serve_file(FIXTURES / "prometheus-common" / "text", TEXT)
    collector = ScrapeCollector(
        [
            loopback.url + "/bad",
            closed_port_url() + "/metrics",
            loopback.url + "/missing",
            loopback.url + "/good",
        ],
        timeout=2,
    )
    for _ in range(2):
        samples = collector.collect(time.time())
        assert samples and collector.take_events() == []
    assert collector.errors == 6
