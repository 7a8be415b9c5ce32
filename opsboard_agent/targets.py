"""Scrape targets and their names.

Every scraped series that is not a core contract metric is stored as `<target>:<series>`, so
two exporters that both expose `go_goroutines` (node_exporter and dcgm-exporter are both Go
programs) keep two series instead of one with two values per timestamp. A target is named
on the command line (`--scrape node=http://127.0.0.1:9100/metrics`) or gets a default from
its port: the exporters' registered ports get their usual job names, anything else
`scrape_<port>`; unnamed targets that would share a default get `_2`, `_3`, ...
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

TARGET_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAMED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.+)$")

# From the Prometheus default port allocations wiki page.
WELL_KNOWN_PORTS = {9100: "node", 9400: "dcgm", 9256: "process"}
_SCHEME_PORTS = {"http": 80, "https": 443}

# An allow-list entry that keeps the buckets of every histogram of a target.
ALL_FAMILIES = "*"


class TargetError(ValueError):
    """A --scrape or --scrape-buckets value that cannot be used (said in the message)."""


@dataclass(frozen=True)
class ScrapeTarget:
    name: str
    url: str
    # Histogram families whose `_bucket` series are kept (dropped by default: a histogram
    # with 12 buckets per label set is most of an exposition and rarely charted).
    buckets: frozenset[str] = field(default_factory=frozenset)

    def keeps_buckets(self, family: str) -> bool:
        return family in self.buckets or ALL_FAMILIES in self.buckets


def default_name(url: str) -> str:
    """`node`, `dcgm`, `process` for the exporters' own ports, else `scrape_<port>`."""
    parts = urlsplit(url)
    try:
        port = parts.port or _SCHEME_PORTS.get(parts.scheme, 0)
    except ValueError as exc:
        raise TargetError(f"{url!r}: {exc}") from exc
    return WELL_KNOWN_PORTS.get(port, f"scrape_{port}")


def parse_targets(values: Iterable[str], buckets: Iterable[str] = ()) -> list[ScrapeTarget]:
    """Targets from `--scrape` values (`NAME=URL` or `URL`) and `--scrape-buckets` values
    (`NAME=FAMILY[,FAMILY...]`, `NAME=*` for all). Named targets keep their names (two with
    one name are refused); unnamed ones get defaults, suffixed when taken."""
    named: list[tuple[str | None, str]] = []
    for value in values:
        match = _NAMED.match(value.strip())
        named.append((match[1], match[2]) if match else (None, value.strip()))
    taken: set[str] = set()
    for name, _ in named:
        if name is not None:
            if name in taken:
                raise TargetError(f"two scrape targets are named {name!r}")
            taken.add(name)
    resolved = []
    for name, url in named:
        if not urlsplit(url).scheme.startswith("http"):
            raise TargetError(f"{url!r} is not an http(s) URL")
        if name is None:
            base = name = default_name(url)
            n = 1
            while name in taken:
                n += 1
                name = f"{base}_{n}"
            taken.add(name)
        resolved.append((name, url))
    keep = _parse_buckets(buckets, taken)
    return [ScrapeTarget(name, url, keep.get(name, frozenset())) for name, url in resolved]


def _parse_buckets(values: Iterable[str], names: set[str]) -> dict[str, frozenset[str]]:
    keep: dict[str, frozenset[str]] = {}
    for value in values:
        match = _NAMED.match(value.strip())
        if not match:
            raise TargetError(f"{value!r}: expected TARGET=FAMILY[,FAMILY...]")
        if match[1] not in names:
            raise TargetError(f"{value!r}: no scrape target is named {match[1]!r}")
        families = {f.strip() for f in match[2].split(",") if f.strip()}
        keep[match[1]] = keep.get(match[1], frozenset()) | families
    return keep
