"""Reading a /metrics exposition in tests: prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

TOKEN = "test-scrape-token"
AUTH = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> tuple[Samples, set[str]]:
    """(sample name, sorted labels) → value, and the family names."""
    samples: Samples = {}
    families = set()
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples, families


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)
