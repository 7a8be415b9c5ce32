"""Node patterns of node-bound tokens (apps/clusters/hostlist.py): Slurm's hostlist form,
widths kept, ambiguity refused."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apps.clusters.hostlist import PatternError, pattern_compile, patterns_match


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpu-001", True),
        ("gpu-128", True),
        ("gpu-129", False),
        ("gpu-000", False),
        ("gpu-7", False),  # the width is part of the name
        ("gpu-0007", False),
        ("gpu-001.lan", False),
        ("xgpu-001", False),
    ],
)
def test_a_padded_range_matches_names_of_its_width_inside_its_bounds(name, expected):
    assert patterns_match(["gpu-[001-128]"], name) is expected


def test_lists_several_groups_and_plain_names():
    patterns = ["rack[1-2]-node[01-04,10]", "login-1"]
    assert patterns_match(patterns, "rack2-node10")
    assert patterns_match(patterns, "rack1-node03")
    assert patterns_match(patterns, "login-1")
    assert not patterns_match(patterns, "rack3-node01")
    assert not patterns_match(patterns, "rack1-node05")
    assert not patterns_match(patterns, "rack01-node01")  # unpadded bound: no leading zero
    assert not patterns_match(patterns, "login-2")


@pytest.mark.parametrize(
    "pattern",
    [
        "",
        "gpu-[]",
        "gpu-[4-1]",
        "gpu-[a-b]",
        "n[1-2][3-4]",
        "n[1-2]0",
        "gpu 1",
        "gpu-[1-2",
        "x" * 256,
    ],
)
def test_it_refuses_what_names_no_node_set(pattern):
    with pytest.raises(PatternError):
        pattern_compile(pattern)


@given(st.integers(0, 9999), st.integers(0, 9999), st.integers(0, 20000))
def test_a_padded_range_holds_exactly_its_numbers(a, b, number):
    lo, hi = min(a, b), max(a, b)
    pattern = f"n[{lo:04d}-{hi:04d}]"
    assert patterns_match([pattern], f"n{number:04d}") is (lo <= number <= hi)


@given(st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True))
def test_a_plain_name_matches_itself_only(name):
    assert patterns_match([name], name)
    assert not patterns_match([name], name + "x")
