"""Silent data corruption: a rank whose checksums or canary disagree with its replicas.

Ranks holding the same shard (all ranks when no shard is reported) must agree: the gradient
checksum after all-reduce and the parameter checksum bit for bit, the canary (local gradients
of a fixed probe batch) within a relative tolerance. At each checked step the minority of a
group is suspect; which evidence disagreed says what went wrong.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from detectors.common import (
    by_step,
    median,
    per_step,
    rank_nodes,
    rel_diff,
    row_nodes,
    run_subject,
)
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.types import ClusterWindow, Finding, RunWindow, StepRow

_RANK = attrgetter("rank")
CANARY_MARK = ";canary="  # in a `shard`: the canary group follows (see canary_group)
# Past this many canaries without a majority, no group is looked for pair by pair (n²).
PAIRWISE_MAX = 64
CAUSES = {
    "param_checksum": "the replica's weights were corrupted",
    "canary": "the GPU computes wrong gradients",
    "grad_checksum": "corruption after the reduction",
}


@dataclass
class _Suspect:
    shard: str | None
    steps: set[int] = field(default_factory=set)
    fields: Counter[str] = field(default_factory=Counter)
    ambiguous_only: bool = True
    peers: set[int] = field(default_factory=set)
    first_ts: float = float("inf")
    checked: set[int] = field(default_factory=set)


def detect(
    window: ClusterWindow, now: float, config: DetectorConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """`sdc` findings of every run of the window (see `detect_run`)."""
    return [f for run in window.runs for f in detect_run(run, now, config)]


def detect_run(
    run: RunWindow, now: float, config: DetectorConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """One finding per suspect rank (`run:<run>/rank:<r>`): critical when it disagreed at
    `sdc_critical_checks` or more checked steps; both ranks of a split with no majority are
    reported as ambiguous."""
    checked = [
        row for rows in by_step(run.steps).values() for row in per_step("sdc", rows, _checked(rows))
    ]
    # Ranks report on their own: a check is judged once every member of its group has
    # reported it, or once every rank has moved past it (a missing one will not come) —
    # judging three of four replicas, two of them corrupt, would blame the healthy one.
    settled = _settled(run.steps)
    shards = _complete(checked, settled, lambda row: row.shard)
    marked = any(row.shard is not None and CANARY_MARK in row.shard for row in checked)
    canaries = _complete(checked, settled, _canary_key) if marked else shards
    suspects: dict[int, _Suspect] = {}
    # The checksums within each shard, the canaries within each canary group.
    corrupt: dict[int, set[int]] = defaultdict(set)  # step -> ranks whose weights differ
    verdicts: list[tuple[int, dict[int, StepRow], str, tuple[list[int], bool]]] = []
    for (step, _), rows in shards.items():
        grad = minority_exact({r: x.grad_checksum for r, x in rows.items()})
        param = minority_exact({r: x.param_checksum for r, x in rows.items()})
        corrupt[step].update(param[0])
        verdicts += [(step, rows, "grad_checksum", grad), (step, rows, "param_checksum", param)]
    for (step, _), rows in canaries.items():
        odd, ambiguous = minority_canary(rows, config.sdc_canary_rtol)
        odd = _unexplained(odd, rows, corrupt[step], config.sdc_canary_rtol)
        verdicts.append((step, rows, "canary", (odd, ambiguous)))
    for step, rows, name, (odd, ambiguous) in verdicts:
        for rank in odd:
            suspect = suspects.setdefault(rank, _Suspect(rows[rank].shard))
            suspect.steps.add(step)
            suspect.fields[name] += 1
            suspect.first_ts = min(suspect.first_ts, rows[rank].ts)
            if ambiguous:
                suspect.peers.update(r for r in odd if r != rank)
            else:
                suspect.ambiguous_only = False
    if not suspects:
        return []
    for (step, _), rows in shards.items():
        for rank in rows.keys() & suspects.keys():
            suspects[rank].checked.add(step)
    nodes = rank_nodes(run)
    return [_finding(run.run, r, nodes.get(r), suspects[r], config) for r in sorted(suspects)]


def canary_group(shard: str | None) -> str | None:
    """The ranks a rank's canary is compared with: those whose `shard` names the same
    canary group after `;canary=` (an FSDP probe computes the whole model's gradient, the
    same on every shard), else those of the same shard."""
    if shard is not None and CANARY_MARK in shard:
        return shard.rsplit(CANARY_MARK, 1)[1]
    return shard


def _canary_key(row: StepRow) -> str | None:
    return canary_group(row.shard)


def _complete(
    checked: list[StepRow], settled: int, key: Callable[[StepRow], str | None]
) -> dict[tuple[int, str | None], dict[int, StepRow]]:
    """The checked rows by (step, group), the groups of two or more whose every member
    reported (or that every rank has moved past)."""
    groups: dict[tuple[int, str | None], dict[int, StepRow]] = defaultdict(dict)
    members: dict[str | None, set[int]] = defaultdict(set)
    for row in checked:
        group = key(row)
        groups[(row.step, group)][row.rank] = row
        members[group].add(row.rank)
    return {
        (step, group): rows
        for (step, group), rows in groups.items()
        if len(rows) >= 2 and (len(rows) == len(members[group]) or step < settled)
    }


def odd_canaries(rows: Mapping[int, StepRow], corrupt: set[int], rtol: float) -> list[int]:
    """The ranks of one step's `rows` whose canary disagrees with its canary group's, less
    those explained by `corrupt` weights (see `_unexplained`): the run page's rule."""
    groups: dict[str | None, dict[int, StepRow]] = defaultdict(dict)
    for rank, row in rows.items():
        groups[canary_group(row.shard)][rank] = row
    return [
        rank
        for group in groups.values()
        for rank in _unexplained(minority_canary(group, rtol)[0], group, corrupt, rtol)
    ]


def _unexplained(
    odd: list[int], rows: Mapping[int, StepRow], corrupt: set[int], rtol: float
) -> list[int]:
    """`odd` less the ranks whose canary is that of a rank with corrupt weights: under FSDP
    a rank all-gathers its peers' shards, so a large corruption of one rank's shard moves
    the canaries of every rank that gathered it, alike; the parameter checksum names the
    rank that holds it, and the others computed right with what they were given."""
    if not odd or not corrupt & rows.keys():
        return odd  # the usual case, in one look
    prints = {rank: _print(row) for rank, row in rows.items() if row.canary_norm is not None}
    sources = [prints[rank] for rank in corrupt if rank in prints]
    return [
        rank
        for rank in odd
        if rank in corrupt
        or rank not in prints
        or not any(_agree(prints[rank], source, rtol) for source in sources)
    ]


def _print(row: StepRow) -> tuple[float, ...]:
    return (row.canary_norm or 0.0, *(row.canary_proj or ()))


def _checked(rows: list[StepRow]) -> Callable[[], list[StepRow]]:
    """The step's reports that carry a check."""
    return lambda: [
        row
        for row in rows
        if row.grad_checksum or row.param_checksum or row.canary_norm is not None
    ]


def _settled(steps: tuple[StepRow, ...]) -> int:
    """The newest step that every rank has reached (the least of the ranks' newest steps),
    -1 without rows: walking steps newest first, the first one by which every rank has
    been seen, which for the usual window is its newest step alone."""
    everyone = len(row_nodes(steps))
    grouped = by_step(steps)
    seen: set[int] = set()
    for number in sorted(grouped, reverse=True):
        seen.update(map(_RANK, grouped[number]))
        if len(seen) == everyone:
            return number
    return -1


def minority_exact(values: Mapping[int, str | None]) -> tuple[list[int], bool]:
    """(ranks outside the agreeing group, False), or every rank and True when no group
    stands out (a split 1–1 or 2–2 cannot say which side is wrong). The agreeing group is
    the largest set of equal values, if it has two or more and no other is as large: two
    corrupt replicas rarely corrupt alike, so A A B C blames B and C."""
    present = {rank: v for rank, v in values.items() if v}
    if len(present) < 2:
        return [], False
    counts = Counter(present.values()).most_common(2)
    top, count = counts[0]
    if count == len(present):
        return [], False
    if count >= 2 and (len(counts) == 1 or counts[1][1] < count):
        return [rank for rank, v in present.items() if v != top], False
    return list(present), True


def minority_canary(rows: Mapping[int, StepRow], rtol: float) -> tuple[list[int], bool]:
    """Like `minority_exact` for canaries: a rank agrees when its norm and projections are
    within `rtol` of the group's component-wise median (the majority's value)."""
    prints = {
        rank: (row.canary_norm, *(row.canary_proj or ()))
        for rank, row in rows.items()
        if row.canary_norm is not None
    }
    if len(prints) < 2:
        return [], False
    if len(prints) == 2:
        (ra, a), (rb, b) = prints.items()
        return ([ra, rb], True) if not _agree(a, b, rtol) else ([], False)
    width = Counter(len(p) for p in prints.values()).most_common(1)[0][0]
    # Usually everyone agrees: when each component's extremes are within the tolerance,
    # every pair is, and the per-rank comparison can be skipped.
    if all(len(p) == width for p in prints.values()) and all(
        rel_diff(min(column), max(column)) <= rtol for column in zip(*prints.values(), strict=True)
    ):
        return [], False
    # Most often the component-wise median is the majority's value: one pass finds it.
    reference = tuple(median([p[i] for p in prints.values() if len(p) > i]) for i in range(width))
    group = {rank for rank, p in prints.items() if _agree(p, reference, rtol)}
    if len(group) * 2 > len(prints):
        return [rank for rank in prints if rank not in group], False
    if len(prints) > PAIRWISE_MAX:
        return list(prints), True
    # Otherwise the agreeing group is the ranks within tolerance of the rank most others
    # agree with; as in minority_exact it must have two or more and stand out.
    agreeing = {
        rank: {other for other, q in prints.items() if _agree(p, q, rtol)}
        for rank, p in prints.items()
    }
    best = max(agreeing, key=lambda rank: (len(agreeing[rank]), -rank))
    outside = [rank for rank in prints if rank not in agreeing[best]]
    rival = max((len(agreeing[rank]) for rank in outside), default=0)
    if len(agreeing[best]) >= 2 and rival < len(agreeing[best]):
        return outside, False
    return list(prints), True


def _agree(a: tuple[float, ...], b: tuple[float, ...], rtol: float) -> bool:
    return len(a) == len(b) and all(rel_diff(x, y) <= rtol for x, y in zip(a, b, strict=True))


def _finding(
    run: str, rank: int, node: str | None, suspect: _Suspect, config: DetectorConfig
) -> Finding:
    # The most telling evidence names the cause: diverged weights explain everything else;
    # a wrong canary with equal weights points at the GPU's arithmetic.
    cause_field = next(
        f for f in ("param_checksum", "canary", "grad_checksum") if suspect.fields[f]
    )
    cause = CAUSES[cause_field]
    where = f" on {node}" if node else ""
    shard = f" of shard {suspect.shard}" if suspect.shard else ""
    checks = len(suspect.steps)
    disagreed = ", ".join(f.replace("_", " ") for f in sorted(suspect.fields))
    if suspect.ambiguous_only:
        peers = ", ".join(f"rank {p}" for p in sorted(suspect.peers)) or "its peers"
        summary = (
            f"rank {rank}{where}{shard} and {peers} disagree ({disagreed}) with no majority "
            f"at {checks} check(s): one of them is corrupt ({cause}?)"
        )
    else:
        summary = (
            f"rank {rank}{where}{shard} disagrees with its replicas ({disagreed}) at "
            f"{checks} check(s): {cause}"
        )
    return Finding(
        kind="sdc",
        subject=run_subject(run, rank=rank),
        severity="critical" if checks >= config.sdc_critical_checks else "warning",
        summary=summary,
        run=run,
        node=node,
        rank=rank,
        evidence={
            "rank": rank,
            "node": node,
            "shard": suspect.shard,
            "cause": cause,
            "disagreed": dict(sorted(suspect.fields.items())),
            "checks_disagreed": checks,
            "checks_seen": len(suspect.checked),
            "steps": sorted(suspect.steps)[-10:],
            "ambiguous": suspect.ambiguous_only,
            "peers": sorted(suspect.peers),
        },
        since=suspect.first_ts,
    )
