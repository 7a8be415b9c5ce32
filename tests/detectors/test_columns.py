"""Series as columns (times and values as numpy arrays): the detectors that read the columns
with numpy find what they found walking (ts, value) tuples in Python, on series with jitter,
spikes, stray readings, repeated times and faults."""

from __future__ import annotations

import pickle
from functools import partial

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors import detect_all, thermal
from detectors.common import (
    median,
)
from detectors.config import DEFAULT_CONFIG
from detectors.sustained import (
    mask_bits,
    over,
    sustained,
    sustained_met,
    sustained_tails,
    sustained_tails_each,
)
from detectors.types import Series
from tests.detectors.builders import T0, cluster


def points_of(gap_list: list[float], values: list[float]) -> tuple[tuple[float, float], ...]:
    times = np.cumsum([T0, *gap_list])[: len(values)].tolist()
    return tuple(zip(times, values, strict=False))


@st.composite
def temperatures(draw: st.DrawFn) -> tuple[tuple[float, float], ...]:
    """A GPU's temperatures: samples about a second apart, some at the same time and some
    after a gap, a level near the limit, jitter, and stray spikes either way (the noise
    from a seeded generator: hypothesis draws its shape, not every sample)."""
    count = draw(st.integers(0, 90))
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    kinds = rng.choice(3, size=count, p=[0.8, 0.1, 0.1])
    gap_list = np.where(
        kinds == 0, rng.uniform(0.5, 1.5, count), np.where(kinds == 1, 0.0, rng.uniform(5, 40))
    ).tolist()
    level = draw(st.floats(70.0, 95.0))
    values = level + rng.uniform(-4.0, 4.0, count + 1)
    spikes = rng.random(count + 1) < draw(st.sampled_from([0.0, 0.05, 0.2]))
    values = np.where(spikes, values + rng.choice([-30.0, 30.0], count + 1), values)
    return points_of(gap_list, values.tolist())


# shares such as 0.8 meet their bar exactly (4 of 5 samples): the edge of `>=`
shares = st.one_of(st.sampled_from([0.5, 0.6, 0.75, 0.8, 1.0]), st.floats(0.3, 1.0))


@given(
    temperatures(), st.floats(70.0, 95.0), st.one_of(st.floats(0.0, 120.0), st.integers()), shares
)
def test_sustained_over_columns_finds_what_the_python_walk_finds(points, limit, span, share):
    if isinstance(span, int):  # a span reaching back exactly to a sample (the search's edge)
        span = points[-1][0] - points[span % len(points)][0] if points else 0.0
    series = Series("n", "gpu.temp_c", 0, points)
    expected = sustained(points, lambda v: v > limit, span, share)
    assert sustained_met(series.times, series.values > limit, span, share) == expected


@given(st.lists(temperatures(), max_size=6), st.floats(70.0, 95.0), st.floats(0.0, 60.0), shares)
def test_the_tails_of_many_series_at_once_say_no_where_sustained_says_none(
    many, limit, span, share
):
    """`sustained_tails` is the first test of `sustained_where`, for many series in one
    numpy pass: where it says False the series cannot be sustained, and where it says True
    the newest `span` of the series keeps `share` (thermal walks only those GPUs)."""
    series = [Series("n", "gpu.temp_c", gpu, points) for gpu, points in enumerate(many)]
    passed = sustained_tails(series, partial(over, limit=limit), span, share)
    assert len(passed) == len(series)
    for each, yes, points in zip(series, passed, many, strict=True):
        found = sustained_met(each.times, each.values > limit, span, share)
        if not yes:
            assert found is None
        if found is not None:
            assert yes
        reaches = bool(points) and points[-1][0] - points[0][0] >= span
        recent = [v for t, v in points if reaches and t >= points[-1][0] - span]
        assert yes == (reaches and sum(v > limit for v in recent) >= share * len(recent))


masks = st.one_of(
    st.integers(0, 0x3FF).map(float),
    st.floats(0.0, 1024.0),
    st.integers(-(2**40), 2**40).map(float),
    st.floats(2.0**62, 2.0**70),  # past int64: read one by one, as int() reads them
)


@given(st.lists(masks, max_size=40), st.sampled_from([thermal.THERMAL_BITS, thermal.POWER_BITS]))
def test_mask_bits_reads_each_sample_as_int_does(values, bits):
    column = np.array(values, dtype=np.float64)
    assert mask_bits(column, bits).tolist() == [bool(int(v) & bits) for v in values]


def test_a_series_built_from_points_or_columns_is_the_same_series():
    points = ((T0, 1.0), (T0 + 1, 2.5), (T0 + 1, 3.0))
    columns = Series("n", "m", 3, times=[p[0] for p in points], values=[p[1] for p in points])
    built = Series("n", "m", 3, points)
    assert built == columns and hash(built) == hash(columns)
    assert built.points == points and list(built.points) == list(points)
    assert built.points[-1] == (T0 + 1, 3.0) and built.points[1:] == points[1:]
    assert list(reversed(built.points)) == list(reversed(points))
    assert built != Series("n", "m", 3, points[:2])
    assert pickle.loads(pickle.dumps(built)) == built
    assert not Series("n", "m", None).points and len(Series("n", "m", None)) == 0


def test_a_series_cannot_be_changed():
    series = Series("n", "m", 0, ((T0, 1.0),))
    for change in (lambda: setattr(series, "node", "x"), lambda: series.times.__setitem__(0, 2)):
        try:
            change()
        except (AttributeError, ValueError):
            continue
        raise AssertionError("a Series changed")


# The thermal and power decisions as the detector made them walking tuples (before the
# columns): a reference to compare the columnar detector's findings with.
def thermal_reference(temps, masks_points, power, limits):
    config = DEFAULT_CONFIG
    share = config.sustain_share
    mask = int(masks_points[-1][1]) if masks_points else 0
    hot = sustained(temps, lambda v: v > config.thermal_temp_c, config.thermal_temp_s, share)
    throttled = sustained(
        masks_points, lambda v: int(v) & thermal.THERMAL_BITS, config.throttle_s, share
    )
    found = {}
    if hot is not None or throttled is not None:
        temp = None
        if temps:
            end = temps[-1][0]
            temp = median([v for t, v in temps if t >= end - config.thermal_temp_s])
        found["thermal"] = (min(s for s in (hot, throttled) if s is not None), temp)
    if power and limits and limits[-1][1] > 0:
        limit = limits[-1][1]
        at_cap = sustained(power, lambda v: v >= config.power_share * limit, config.power_s, share)
        capped = sustained(
            masks_points, lambda v: int(v) & thermal.POWER_BITS, config.power_s, share
        )
        if at_cap is not None and capped is not None:
            found["power"] = (max(at_cap, capped), power[-1][1])
    return found, mask


@st.composite
def gpu_telemetry(draw: st.DrawFn) -> dict[str, tuple[tuple[float, float], ...]]:
    """One GPU's temperature, throttle mask, power and limit series, every ~10 s, with a
    fault (hot, throttled, capped) starting somewhere or none, jitter and stray readings."""
    count = draw(st.integers(0, 45))
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    gap_list = (10.0 + rng.uniform(-2.0, 2.0, count)).tolist()
    onset = draw(st.integers(0, count + 1))
    strays = draw(st.sets(st.integers(0, count), max_size=3))
    fault = draw(st.sampled_from(["none", "hot", "throttled", "capped"]))
    limit = draw(st.sampled_from([0.0, 700.0]))
    faulted = [i >= onset and i not in strays for i in range(count + 1)]
    temps = np.where(faulted, 91.0 if fault == "hot" else 70.0, 70.0) + rng.uniform(
        -3, 3, count + 1
    )
    bits = {"throttled": 0x40, "capped": 0x04}.get(fault, 0)
    masks_values = np.where(faulted, float(bits), 0.0)
    power = np.where(faulted, 699.0 if fault == "capped" else 400.0, 400.0)
    power = power + rng.uniform(-5, 5, count + 1)
    temps, masks_values, power = temps.tolist(), masks_values.tolist(), power.tolist()
    return {
        "gpu.temp_c": points_of(gap_list, temps),
        "gpu.throttle_reasons": points_of(gap_list, masks_values),
        "gpu.power_w": points_of(gap_list, power),
        "gpu.power_limit_w": points_of(gap_list, [limit] * (count + 1)),
    }


@settings(max_examples=150)
@given(st.lists(gpu_telemetry(), min_size=1, max_size=4))
def test_thermal_over_columns_finds_what_the_tuple_walk_found(gpus):
    telemetry = [
        Series("n0", metric, gpu, points)
        for gpu, metrics in enumerate(gpus)
        for metric, points in metrics.items()
        if points
    ]
    window = cluster(telemetry=telemetry)
    findings = {(f.kind, f.gpu): f for f in thermal.detect(window, T0)}
    expected = {}
    for gpu, metrics in enumerate(gpus):
        found, mask = thermal_reference(
            metrics["gpu.temp_c"],
            metrics["gpu.throttle_reasons"],
            metrics["gpu.power_w"],
            metrics["gpu.power_limit_w"],
        )
        for kind, (since, value) in found.items():
            expected[kind, gpu] = (since, value, mask)
    assert {
        key: (
            f.since,
            f.evidence["temp_c"] if f.kind == "thermal" else f.evidence["power_w"],
            f.evidence["throttle_mask"],
        )
        for key, f in findings.items()
    } == expected
    # and the whole pass finds the same over a window built from columns
    columns = [
        Series(s.node, s.metric, s.gpu, times=s.times.copy(), values=s.values.copy())
        for s in telemetry
    ]
    assert detect_all(cluster(telemetry=columns), T0) == detect_all(window, T0)


@given(
    st.lists(temperatures(), max_size=6),
    st.lists(st.tuples(st.floats(70.0, 95.0), st.sampled_from([0.0, 10.0, 30.0])), max_size=4),
    shares,
)
def test_conditions_sharing_tails_say_what_each_says_alone(many, conditions, share):
    """`sustained_tails_each` joins the tails of each span once for all its conditions:
    whatever the spans (equal or not), each condition's answer is `sustained_tails`'."""
    series = [Series("n", "gpu.temp_c", gpu, points) for gpu, points in enumerate(many)]
    each = [(partial(over, limit=limit), span) for limit, span in conditions]
    together = sustained_tails_each(series, each, share)
    assert together == [sustained_tails(series, met_of, span, share) for met_of, span in each]
