"""Node name patterns in Slurm's hostlist form, for node-bound agent tokens.

A pattern is a node name in which bracketed groups stand for numbers: `gpu-[001-128]`,
`rack[1-4]-node[01-16,20]`. Inside brackets, comma-separated numbers and ranges `lo-hi`; a
bound written with leading zeros (`001`) fixes the width (`gpu-007` matches `gpu-[001-128]`,
`gpu-7` does not), one without matches the number as written without leading zeros. Two groups
need something between them (`n[1-2][3-4]` is ambiguous). Pure Python: no Django.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

NAME_CHARS = r"[A-Za-z0-9._-]"
_TOKEN = re.compile(rf"({NAME_CHARS}+)|\[([0-9,-]+)\]")
PATTERN_MAX_LENGTH = 255  # as clusters_node.name


class PatternError(ValueError):
    """A pattern that names no node set; the message says what is wrong."""


@dataclass(frozen=True)
class _Range:
    lo: int
    hi: int
    width: int  # 0: written without leading zeros


@dataclass(frozen=True)
class _Pattern:
    regex: re.Pattern[str]
    groups: tuple[tuple[_Range, ...], ...]

    def matches(self, name: str) -> bool:
        found = self.regex.fullmatch(name)
        if found is None:
            return False
        return all(
            any(_in_range(digits, item) for item in group)
            for digits, group in zip(found.groups(), self.groups, strict=True)
        )


def _in_range(digits: str, item: _Range) -> bool:
    if item.width:
        if len(digits) != item.width:
            return False
    elif len(digits) > 1 and digits.startswith("0"):
        return False
    return item.lo <= int(digits) <= item.hi


def _group(text: str, pattern: str) -> tuple[_Range, ...]:
    items = []
    for part in text.split(","):
        lo_text, _, hi_text = part.partition("-")
        hi_text = hi_text or lo_text
        if not lo_text.isdigit() or not hi_text.isdigit():
            raise PatternError(f"{pattern!r}: [{text}] holds numbers and ranges such as 1-8")
        lo, hi = int(lo_text), int(hi_text)
        if lo > hi:
            raise PatternError(f"{pattern!r}: the range {part} runs backwards")
        padded = len(lo_text) > 1 and lo_text.startswith("0")
        items.append(_Range(lo, hi, len(lo_text) if padded else 0))
    return tuple(items)


@functools.lru_cache(maxsize=4096)
def pattern_compile(pattern: str) -> _Pattern:
    """The compiled pattern; PatternError if it is not one."""
    if not pattern or len(pattern) > PATTERN_MAX_LENGTH:
        raise PatternError(f"a node pattern is 1 to {PATTERN_MAX_LENGTH} characters")
    regex, groups, position, last_was_group = [], [], 0, False
    for token in _TOKEN.finditer(pattern):
        if token.start() != position:
            break
        literal, bracket = token.groups()
        if bracket is not None:
            if last_was_group:
                raise PatternError(f"{pattern!r}: two bracket groups need a character between")
            groups.append(_group(bracket, pattern))
            regex.append(r"([0-9]+)")
        else:
            if last_was_group and literal[0].isdigit():
                raise PatternError(f"{pattern!r}: a digit right after [..] is ambiguous")
            regex.append(re.escape(literal))
        last_was_group = bracket is not None
        position = token.end()
    if position != len(pattern):
        raise PatternError(
            f"{pattern!r}: a node name of letters, digits, '.', '_' and '-', with [1-8] groups"
        )
    return _Pattern(re.compile("".join(regex)), tuple(groups))


def patterns_match(patterns: Iterable[str], name: str) -> bool:
    """True if `name` is one of the names the patterns stand for."""
    return any(pattern_compile(pattern).matches(name) for pattern in patterns)
