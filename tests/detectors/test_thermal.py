"""Thermal and power: temperatures, throttle reasons decoded, power capping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from detectors import thermal
from detectors.thermal import REASONS, throttle_reasons
from tests.detectors.builders import T0, cluster, series


def test_it_decodes_every_nvml_reason_bit():
    assert throttle_reasons(0) == []
    assert throttle_reasons(0x60) == ["SW_THERMAL_SLOWDOWN", "HW_THERMAL_SLOWDOWN"]
    assert throttle_reasons(0x1FF) == list(REASONS.values())
    assert throttle_reasons(0x84) == ["SW_POWER_CAP", "HW_POWER_BRAKE_SLOWDOWN"]
    assert throttle_reasons(8.0) == ["HW_SLOWDOWN"]  # telemetry values are floats
    assert throttle_reasons(0x201) == ["GPU_IDLE", "UNKNOWN_0x200"]


@given(st.integers(0, 0x1FF))
def test_decoding_names_each_set_bit_once(mask):
    names = throttle_reasons(mask)
    assert names == [REASONS[b] for b in REASONS if mask & b]


def gpu(temps=None, masks=None, power=None, limit=700.0, every=10.0):
    out = []
    if temps is not None:
        out.append(series("n0", "gpu.temp_c", temps, gpu=1, every=every))
    if masks is not None:
        out.append(series("n0", "gpu.throttle_reasons", masks, gpu=1, every=every))
    if power is not None:
        out.append(series("n0", "gpu.power_w", power, gpu=1, every=every))
        out.append(series("n0", "gpu.power_limit_w", [limit] * len(power), gpu=1, every=every))
    return thermal.detect(cluster(telemetry=out), T0 + 600)


def test_a_healthy_gpu_is_fine():
    assert gpu([63 + (-1) ** i * 0.8 for i in range(60)], [0] * 60, [634] * 60) == []


@pytest.mark.parametrize(("hot_points", "expected"), [(3, 0), (4, 1)])
def test_it_flags_a_gpu_over_the_limit_for_30_seconds(hot_points, expected):
    # points 10 s apart: 4 hot points span 30 s
    found = gpu([63] * 10 + [92] * hot_points)
    assert len(found) == expected
    if expected:
        (f,) = found
        assert f.subject == "node:n0/gpu:1" and f.severity == "critical"
        assert "GPU 1 of n0 runs at 92 °C" in f.summary


def test_85_to_90_degrees_is_a_warning():
    (f,) = gpu([63] * 10 + [87] * 5)
    assert f.severity == "warning"


@pytest.mark.parametrize(("minutes", "expected"), [(3.9, 0), (4, 1), (5, 1)])
def test_thermal_throttling_for_five_minutes_is_flagged_and_decoded(minutes, expected):
    # "For five minutes" is at least 80% of the samples of the last five minutes (25 of 31).
    points = int(minutes * 6) + 1
    found = gpu([80] * (30 + points), [0] * 30 + [0x40] * points)
    assert len(found) == expected
    if expected:
        (f,) = found
        assert f.evidence["throttle_reasons"] == ["HW_THERMAL_SLOWDOWN"]
        assert "HW_THERMAL_SLOWDOWN" in f.summary


@pytest.mark.parametrize(
    ("watts", "mask", "expected"), [(690, 0x4, 1), (680, 0x4, 0), (690, 0x0, 0), (699, 0x80, 1)]
)
def test_power_capping_needs_both_the_draw_and_the_reason(watts, mask, expected):
    found = gpu(masks=[mask] * 31, power=[watts] * 31)
    assert [f.kind for f in found] == ["power"] * expected
    if expected:
        assert found[0].evidence["throttle_reasons"] == throttle_reasons(mask)
