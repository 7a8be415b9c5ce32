"""The heat-map's arithmetic on numpy matrices gives, to the bit, what it gave on lists: the
values rounded as round() rounds, each cell over its column's median, the robust colour
range. The list versions below are the reference."""

from __future__ import annotations

import math
import statistics

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from apps.dashboard.charts.ranks import (
    HEATMAP_MIN_SPREAD,
    HEATMAP_PERCENTILES,
    _ratios_to_median,
    _robust_range,
)
from apps.dashboard.selectors.runs import decimals_rounded, nan_to_none


def reference_ratios(z: list[list[float | None]]) -> list[list[float | None]]:
    columns = list(zip(*z, strict=True)) if z else []
    medians = [
        statistics.median(values) if (values := [v for v in column if v is not None]) else None
        for column in columns
    ]
    return [
        [round(v / m, 4) if v is not None and m else None
         for v, m in zip(row, medians, strict=True)]
        for row in z
    ]  # fmt: skip


def reference_range(ratios: list[list[float | None]]) -> tuple[float, float]:
    values = sorted(v for row in ratios for v in row if v is not None)
    low = high = 1.0
    if values:
        low = values[int((len(values) - 1) * HEATMAP_PERCENTILES[0] / 100)]
        high = values[math.ceil((len(values) - 1) * HEATMAP_PERCENTILES[1] / 100)]
    return min(low, 1 - HEATMAP_MIN_SPREAD), max(high, 1 + HEATMAP_MIN_SPREAD)


# few distinct values: ties, equal medians, even and odd counts, zero medians and NaN holes
cell = st.one_of(
    st.none(),
    st.sampled_from([0.0, 0.75, 0.8, 0.80004, 1.0, 1.00005, 3.0]),
    st.floats(min_value=1e-6, max_value=1e3),
)


@st.composite
def matrices(draw) -> list[list[float | None]]:
    rows, columns = draw(st.integers(0, 9)), draw(st.integers(0, 7))
    return [[draw(cell) for _ in range(columns)] for _ in range(rows)]


def as_matrix(z: list[list[float | None]], columns: int) -> np.ndarray:
    return np.array(z, dtype=np.float64).reshape(len(z), columns)


@given(matrices())
def test_the_ratios_and_colour_range_are_those_of_the_lists(z):
    columns = len(z[0]) if z else 0
    ratios = _ratios_to_median(as_matrix(z, columns))
    assert nan_to_none(ratios) == reference_ratios(z)
    assert _robust_range(ratios) == reference_range(reference_ratios(z))


def test_it_rounds_as_round_does_even_a_hair_above_a_half():
    # 0.00005 is a hair above the half in binary (round: 0.0001), but × 10⁴ gives exactly 0.5,
    # which numpy's rint alone takes to the even 0.0
    values = np.array([0.00005, 1.00005, 2.5e-7, 0.1234565, 7.0000005, -0.00015, 1e12 + 0.3])
    assert np.round(values[0], 4) != round(0.00005, 4)
    for places in (4, 6):
        assert decimals_rounded(values, places).tolist() == [
            round(v, places) for v in values.tolist()
        ]


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), max_size=50))
def test_it_rounds_any_finite_value_as_round_does(values):
    for places in (4, 6):
        got = decimals_rounded(np.array(values, dtype=np.float64), places).tolist()
        assert got == [round(v, places) for v in values]
