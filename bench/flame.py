"""Summarise a py-spy profile (`py-spy record --format raw`) as the tables of
docs/performance-history.md: inclusive and self % per function, and % per component.

    python bench/flame.py web.raw --keep handle_request
    python bench/flame.py celery.raw --keep fast_trace_task --top 20

`--keep` keeps the stacks that pass through a frame matching it (the request or the task),
from that frame down, so idle threads (a connection pool's waiters, the worker's event
loop) do not dilute the shares. Inclusive % = share of the kept samples whose stack holds
the function at least once; line numbers are dropped, so a function's lines count together.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterator

COMPONENTS = {
    "pydantic": r"pydantic",
    "psycopg": r"psycopg",
    "Django ORM (django/db)": r"django/db/",
    "Django request + middleware": r"django/core/handlers|django/middleware|django/contrib",
    "Celery / kombu / billiard": r"celery/|kombu/|billiard/",
    "Redis client": r"redis/",
    "gzip / zlib": r"gzip|zlib",
    "stdlib json": r"\(json/",
    "logging": r"\(logging/",
}


def stacks(path: str) -> Iterator[tuple[list[str], int]]:
    with open(path) as lines:
        for line in lines:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack:
                yield [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")], int(count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="py-spy raw output")
    parser.add_argument("--keep", default="", help="keep stacks through a frame matching this")
    parser.add_argument("--top", type=int, default=25, help="functions to list (25)")
    args = parser.parse_args()

    everything = list(stacks(args.path))
    kept = []  # each kept stack from the frame matching --keep down: no runner frames
    for frames, count in everything:
        first = next((i for i, f in enumerate(frames) if re.search(args.keep, f)), None)
        if first is not None:
            kept.append((frames[first:], count))
    total = sum(c for _, c in kept) or 1
    inclusive, own, components = Counter(), Counter(), Counter()
    for frames, count in kept:
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
        for name, pattern in COMPONENTS.items():
            if any(re.search(pattern, frame) for frame in frames):
                components[name] += count
    print(f"{total:,} of {sum(c for _, c in everything):,} samples kept (--keep {args.keep!r})")
    print("| function | inclusive % | self % |\n|---|---:|---:|")
    for frame, count in inclusive.most_common(args.top):
        print(f"| `{frame}` | {100 * count / total:.1f} | {100 * own[frame] / total:.1f} |")
    print("\n| component (a stack may count for several) | inclusive % |\n|---|---:|")
    for name, count in components.most_common():
        print(f"| {name} | {100 * count / total:.1f} |")


if __name__ == "__main__":
    main()
