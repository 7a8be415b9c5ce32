"""Scraped counters become per-second rates; the text fast path agrees with the parser."""

import pytest

from opsboard_agent.collectors.scrape import ExpositionError, TargetReader, parse_exposition
from opsboard_agent.targets import ScrapeTarget
from tests.agent.conftest import FIXTURES

TEXT = "text/plain; version=0.0.4"
COUNTER = '# TYPE requests_total counter\nrequests_total{code="200"} {}\nup 1\n'


def read(reader, text, now, content_type=TEXT):
    return {
        (s["metric"], s.get("gpu")): s["value"]
        for s in reader.read(text, content_type, now).samples()
    }


def test_a_counter_is_a_rate_from_the_second_scrape_and_a_reset_gives_no_spike():
    reader = TargetReader(ScrapeTarget("web", "http://x"))
    rate = ("web:requests_total.code_200.rate", None)
    seen = []
    for now, value in [(100.0, 50), (102.0, 70), (104.0, 75), (106.0, 3), (108.0, 13)]:
        samples = read(reader, COUNTER.replace("{}", str(value)), now)
        assert samples[("web:up", None)] == 1.0  # gauges every scrape
        seen.append(samples.get(rate))
    # No rate until two points; 10/s, 2.5/s; the drop (exporter restarted) gives none;
    # then the rate since the restart.
    assert seen == [None, 10.0, 2.5, None, 5.0]


def test_histograms_keep_sum_and_count_as_rates_and_buckets_only_when_allow_listed():
    text = (
        "# TYPE lat histogram\n"
        'lat_bucket{le="1"} A\nlat_bucket{le="+Inf"} B\nlat_sum A\nlat_count B\n'
        "# TYPE q summary\n"
        'q{quantile="0.5"} 0.25\nq_sum A\nq_count B\n'
    )
    for target, buckets in [
        (ScrapeTarget("a", "x"), False),
        (ScrapeTarget("b", "x", frozenset({"lat"})), True),
    ]:
        reader = TargetReader(target)
        read(reader, text.replace("A", "1").replace("B", "2"), 10.0)
        samples = read(reader, text.replace("A", "5").replace("B", "10"), 12.0)
        name = target.name
        assert samples[(f"{name}:lat_sum.rate", None)] == 2.0
        assert samples[(f"{name}:lat_count.rate", None)] == 4.0
        assert samples[(f"{name}:q_count.rate", None)] == 4.0
        assert samples[(f"{name}:q.quantile_0.5", None)] == 0.25  # quantiles stay gauges
        assert ((f"{name}:lat_bucket.le_1.rate", None) in samples) is buckets


def test_the_fast_path_reads_what_the_parser_reads_and_rejects_what_it_rejects():
    text = (FIXTURES / "node_exporter" / "e2e-output.txt").read_text()
    fast = TargetReader(ScrapeTarget("node", "x"))
    read(fast, text, 1.0)
    changed = text.replace("node_boot_time_seconds 1.418183276e+09", "node_boot_time_seconds 7")
    assert changed != text
    fast_samples = read(fast, changed, 2.0)
    assert fast.slow_parses == 1  # the second scrape took the fast path
    slow = TargetReader(ScrapeTarget("node", "x"))
    read(slow, text, 1.0)
    slow.layout = None  # forces the parser
    assert read(slow, changed, 2.0) == fast_samples
    assert fast_samples[("node:node_boot_time_seconds", None)] == 7.0
    # Lines the fast path does not take go to the parser, whose verdict stands.
    for bad in ("node_boot_time_seconds 1_000", "node_boot_time_seconds x", "garbage{"):
        bad_text = text.replace("node_boot_time_seconds 1.418183276e+09", bad)
        with pytest.raises(ExpositionError):
            parse_exposition(bad_text, TEXT)
        with pytest.raises(ExpositionError):
            fast.read(bad_text, TEXT, 3.0)
    assert read(fast, text, 4.0)[("node:node_boot_time_seconds", None)] == 1.418183276e09


def test_same_named_series_of_two_targets_stay_apart_and_single():
    text = 'go_goroutines 7\ngo_goroutines 7\n# TYPE x gauge\nx{gpu="0"} 1\n'
    a = read(TargetReader(ScrapeTarget("node", "x")), text, 1.0)
    b = read(TargetReader(ScrapeTarget("process", "x")), text, 1.0)
    assert a == {("node:go_goroutines", None): 7.0, ("node:x", 0): 1.0}
    assert b == {("process:go_goroutines", None): 7.0, ("process:x", 0): 1.0}
