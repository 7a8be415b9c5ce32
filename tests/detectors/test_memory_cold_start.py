"""`oom_risk` on a job's first minutes (issue 29): flat memory that jitters is no growth,
however few or noisy the first samples; a real climb still is, with its ETA.

Before the fix, `make demo`'s first 4 seconds raised 9 `oom_risk` warnings ("GPU 4 of
demo-node-00 uses 78% of its memory, growing 52 MiB/s: full in about 6 min"): the
Theil–Sen slope of five samples a second apart of a flat series jittering by 0.2 %.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors import detect_all, memory
from detectors.evaluation import AlertRecord, score_scenario
from detectors.types import Series
from opsboard_agent.sim.layout import layout_build
from opsboard_agent.sim.model import ClusterModel, SimConfig
from opsboard_agent.sim.noise import Noise
from opsboard_agent.sim.scenario import scenario_build
from tests.detectors.builders import T0, cluster
from tests.detectors.demo import DEMO_SEED, demo_model, demo_play
from tests.detectors.simwin import BASE_TS

FAST = settings(max_examples=20, deadline=None, derandomize=True)
TOTAL = 80 * 2**30
MIB = 2**20


def memory_series(used: list[tuple[float, float]], gpu: int = 3) -> list[Series]:
    return [
        Series("n1", memory.USED, gpu, tuple(used)),
        Series("n1", memory.TOTAL, gpu, tuple((t, float(TOTAL)) for t, _ in used)),
    ]


def risks_over_time(used: list[tuple[float, float]], every: int = 1) -> list[tuple[float, str]]:
    """(now, summary) of every `oom_risk` at each `every`-th sample, as the alerts service
    would see the series arrive."""
    out = []
    for i in range(0, len(used), every):
        now = used[i][0]
        window = cluster(telemetry=memory_series([p for p in used[: i + 1] if p[0] >= now - 600]))
        out += [(now, f.summary) for f in memory.detect(window, now) if f.kind == "oom_risk"]
    return out


def flat(seed: int, jitter: float, seconds: int, interval: float, share: float = 0.78):
    """The simulator's healthy GPU: `share` of the total, uniform jitter of ±`jitter`."""
    rng = random.Random(seed)
    count = int(seconds / interval) + 1
    return [
        (T0 + i * interval, share * TOTAL * (1 + jitter * rng.uniform(-1, 1))) for i in range(count)
    ]


@FAST
@given(st.integers(0, 2**32), st.floats(0.0, 0.004), st.sampled_from([1.0, 2.0, 5.0, 10.0]))
def test_flat_jittering_memory_is_no_growth_from_the_first_sample_on(seed, jitter, interval):
    # The demo's 0.2 % and twice it, sampled every 1-10 s, judged at every sample of the
    # first ten minutes (every 5th at 1-2 s: the window is still judged over 120 times).
    used = flat(seed, jitter, 600, interval)
    assert risks_over_time(used, every=5 if interval < 5 else 1) == []


@FAST
@given(st.integers(0, 2**32), st.integers(3, 60), st.floats(0.90, 1.0))
def test_spikes_on_flat_memory_are_no_growth(seed, spacing, peak):
    # Isolated readings near the total every `spacing` samples (never two of the newest three).
    used = flat(seed, 0.002, 600, 1.0)
    for i in range(3 + seed % spacing, len(used), spacing):
        used[i] = (used[i][0], peak * TOTAL)
    assert risks_over_time(used, every=7) == []


@settings(max_examples=10, deadline=None, derandomize=True)
@given(st.integers(0, 2**16))
def test_the_simulators_own_healthy_memory_is_no_growth(seed):
    # The simulator's memory generator itself (its jitter is keyed by seed and time), a
    # sample a second as in the demo, judged every 5 s of a job's first five minutes.
    layout = layout_build(nodes=1, gpus=8)
    model = ClusterModel(
        layout, [], SimConfig(seed=seed, interval=1.0, noise=Noise(cv=0.1, spike_rate=0.01))
    )
    tick = model.advance(300)
    by_gpu: dict[int, list[tuple[float, float]]] = {}
    for s in tick.samples:
        if s.metric == memory.USED and s.gpu is not None:
            by_gpu.setdefault(s.gpu, []).append((T0 + s.t, s.value))
    assert len(by_gpu) == 8
    for used in by_gpu.values():
        assert risks_over_time(used, every=5) == []


@pytest.mark.parametrize("jitter", [0.0, 0.002])
@pytest.mark.parametrize("interval", [1.0, 10.0])
def test_a_real_climb_from_a_jobs_start_is_found_with_its_eta(jitter, interval):
    # 50 MiB/s from 78 %: the total in 17.6 GiB / 50 MiB/s ≈ 6 min.
    rate = 50 * MIB
    base = flat(7, jitter, 180, interval)
    used = [(t, v + rate * (t - T0)) for t, v in base]
    found = risks_over_time(used)
    assert found, "the leak was never found"
    # found once the trend spans its minimum 60 s, not later
    assert found[0][0] - T0 <= 60
    (f,) = memory.detect(cluster(telemetry=memory_series(used)), used[-1][0])
    assert f.evidence["growth_bytes_per_s"] == pytest.approx(rate, rel=0.1)
    eta = (TOTAL - used[-1][1]) / rate
    assert f.evidence["seconds_to_full"] == pytest.approx(eta, rel=0.1)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_climb_that_begins_after_a_flat_minute_is_found_as_early_as_before(seed):
    # The evaluation's oom-creep: flat for a minute, then 78 % → 100 % in 2 min (150 MiB/s),
    # a sample every 10 s. Found 40 s in, as before the noise test (docs/evaluation.md).
    used = flat(seed, 0.002, 210, 10.0)
    used = [(t, v + 150 * MIB * max(0.0, t - T0 - 60)) for t, v in used]
    found = risks_over_time(used)
    assert found and found[0][0] - (T0 + 60) <= 40


def test_a_trend_needs_its_minimum_span():
    # The same steep climb, 5 samples over 40 s: too short to extrapolate (the level is low).
    used = [(T0 + 10 * i, (0.7 + 0.02 * i) * TOTAL) for i in range(5)]
    assert memory.detect(cluster(telemetry=memory_series(used)), used[-1][0]) == []
    longer = [(T0 + 10 * i, (0.7 + 0.02 * i) * TOTAL) for i in range(7)]
    assert [f.kind for f in memory.detect(cluster(telemetry=memory_series(longer)), T0 + 60)] == [
        "oom_risk"
    ]


def test_the_noise_is_the_series_own():
    rng = random.Random(5)
    sigma = 2 * 2**30
    used = [(T0 + 10 * i, 0.78 * TOTAL + sigma * rng.gauss(0, 1)) for i in range(60)]
    assert memory.trend(used).noise == pytest.approx(sigma, rel=0.2)
    climbing = [(t, v + 2**30 * (t - T0)) for t, v in used]  # a trend is no noise
    assert memory.trend(climbing).noise == pytest.approx(memory.trend(used).noise)


def test_a_slope_within_the_series_own_noise_is_no_trend():
    # 88 % with σ = 3 GiB of jitter, 30 samples over 5 minutes: the chance slope of two of
    # these 100 series filled the GPU "in about 7-8 min" before the rise was weighed
    # against the noise.
    for seed in range(100):
        rng = random.Random(seed)
        used = [(T0 + 10 * i, 0.88 * TOTAL + 3 * 2**30 * rng.gauss(0, 1)) for i in range(30)]
        found = memory.detect(cluster(telemetry=memory_series(used)), used[-1][0])
        assert found == [], (seed, found[0].summary)


# --- the demo's first ten minutes ------------------------------------------------------


def test_the_demos_first_two_minutes_raise_no_oom_risk_at_any_second():
    play = demo_play(120)
    for second in range(1, 121):
        now = BASE_TS + second
        found = memory.detect(play.at(now), now)
        assert found == [], (second, [f.summary for f in found])


def _alerts(play, step: float, until: float) -> list[AlertRecord]:
    """The first finding of each (kind, subject), as an alert opened at that moment."""
    opened: dict[tuple[str, str], AlertRecord] = {}
    now = BASE_TS + step
    while now <= BASE_TS + until:
        for f in detect_all(play.at(now), now):
            record = AlertRecord(f.kind, f.subject, now, f.run, f.node, f.rank, f.gpu, f.evidence)
            opened.setdefault((f.kind, f.subject), record)
        now += step
    return list(opened.values())


def _scenario(duration: float, restart: tuple[float, float] | None = None):
    """The demo's scenario file for its first `duration` seconds; after a restart, with
    the earlier session's faults too (they happened, and their alerts may still be open)."""
    scenario = scenario_build(demo_model(), base_ts=BASE_TS, duration=duration, speed=1)
    faults = [f for f in scenario["faults"] if f["at"] <= duration]
    if restart is not None:
        first, gap = restart
        earlier = scenario_build(
            demo_model(), base_ts=BASE_TS - first - gap, duration=first, speed=1
        )
        faults = [f for f in earlier["faults"] if f["at"] <= first] + faults
    scenario["faults"] = faults
    return scenario


@pytest.mark.parametrize("restart", [None, (300.0, 60.0)], ids=["fresh", "restarted"])
def test_the_demos_first_ten_minutes_raise_only_the_faults_it_injects(restart):
    play = demo_play(600, seed=DEMO_SEED, restart=restart)
    alerts = _alerts(play, step=10.0, until=600)
    score = score_scenario(_scenario(600, restart), alerts)
    assert score.false_alarms == (), [(a.kind, a.subject) for a in score.false_alarms]
    assert not any(a.kind == "oom_risk" for a in alerts)
    if restart is None:
        # the injected faults of its first ten minutes are still found by name
        assert [(f.fault, f.found) for f in score.faults] == [
            ("straggler", True),
            ("xid", True),
            ("thermal", True),
        ]
