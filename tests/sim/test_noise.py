"""The simulator's noise model: heavy-tailed per-step jitter, rare spikes, sensor jitter —
keyed, so a noisy model is still a pure function of its inputs."""

from __future__ import annotations

import json
import statistics

import pytest

from opsboard_agent.sim import cli
from opsboard_agent.sim.noise import Noise, lognormal
from tests.sim.helpers import by_step, model_build, play, series


def test_lognormal_factors_have_mean_one_the_configured_spread_and_a_right_tail():
    for cv in (0.1, 0.3):
        values = [lognormal(7, cv, "x", i) for i in range(20000)]
        mean = statistics.fmean(values)
        assert mean == pytest.approx(1.0, abs=0.01)
        assert statistics.pstdev(values) / mean == pytest.approx(cv, rel=0.05)
        # heavy on the slow side: the 99.9th percentile is further above 1 than the 0.1th below
        ordered = sorted(values)
        assert ordered[-20] - 1 > 1 - ordered[20] and min(values) > 0
    assert lognormal(7, 0.0, "x", 1) == 1.0


def test_each_ranks_compute_jitters_by_the_configured_cv_step_to_step():
    tick = play(duration=400, noise=Noise(cv=0.3), nodes=1, gpus=4)
    steps = by_step(tick.steps)
    for rank in range(4):
        computes = [ranks[rank]["compute_time"] for ranks in steps.values()]
        assert statistics.pstdev(computes) / statistics.fmean(computes) == pytest.approx(
            0.3, rel=0.2
        )
    # without noise the model is as before: compute within 1 % of its nominal share
    quiet = by_step(play(duration=100, nodes=1, gpus=4).steps)
    assert all(
        0.79 <= r["compute_time"] <= 0.81 for ranks in quiet.values() for r in ranks.values()
    )


def test_rare_spikes_slow_one_random_rank_2_to_5_times():
    tick = play(duration=3000, noise=Noise(spike_rate=0.01), nodes=2, gpus=4)
    steps = by_step(tick.steps)
    spiked = [
        (number, rank, r["compute_time"] / 0.8)
        for number, ranks in steps.items()
        for rank, r in ranks.items()
        if r["compute_time"] > 1.5 * 0.8
    ]
    # ~1 % of the steps, one rank each, 2-5x, on different ranks over time
    assert 0.004 * len(steps) <= len(spiked) <= 0.02 * len(steps)
    assert len({number for number, _, _ in spiked}) == len(spiked)
    assert all(2.0 * 0.98 <= factor <= 5.0 * 1.02 for _, _, factor in spiked)
    assert len({rank for _, rank, _ in spiked}) >= 4
    # the spiked rank waits least; its peers wait for it
    number, rank, _ = spiked[0]
    assert min(steps[number], key=lambda r: steps[number][r]["comm_wait"]) == rank


def test_a_noisy_model_is_still_a_pure_function_of_its_inputs():
    noise = Noise(cv=0.3, spike_rate=0.05)
    whole = model_build(noise=noise, seed=3).advance(200)
    pieces = model_build(noise=noise, seed=3)
    parts = [pieces.advance(t) for t in range(10, 201, 10)]
    assert [s.fields for s in whole.steps] == [s.fields for p in parts for s in p.steps]
    assert whole.samples == [s for p in parts for s in p.samples]
    other = model_build(noise=noise, seed=4).advance(200)
    assert [s.fields for s in other.steps] != [s.fields for s in whole.steps]


def test_telemetry_jitters_but_a_healthy_gpu_never_looks_hot():
    quiet = play(duration=600, nodes=1, gpus=2)
    noisy = play(duration=600, nodes=1, gpus=2, noise=Noise(cv=0.3))

    def spread(tick, metric, gpu=0):
        values = [v for _, v in series(tick.samples, "sim-node-00", metric, gpu)]
        return statistics.pstdev(values) / statistics.fmean(values), values

    assert spread(noisy, "gpu.power_w")[0] > 3 * spread(quiet, "gpu.power_w")[0]
    assert spread(noisy, "host.cpu_util", None)[0] > spread(quiet, "host.cpu_util", None)[0]
    temps = spread(noisy, "gpu.temp_c")[1]
    assert statistics.pstdev(temps) > 2.0 and max(temps) < 80.0


def test_the_cli_turns_noise_and_spikes_on_by_default_and_writes_them_into_the_scenario(
    tmp_path, capsys
):
    base = ["--dry-run", "--duration", "60", "--nodes", "1", "--gpus", "2"]
    assert cli.main([*base, "--scenario-out", str(tmp_path / "a.json")]) == 0
    assert json.loads((tmp_path / "a.json").read_text())["noise"] == {
        "cv": 0.1,
        "spike_rate": 0.01,
    }
    args = ["--noise-cv", "0.3", "--no-spikes", "--scenario-out", str(tmp_path / "b.json")]
    assert cli.main([*base, *args]) == 0
    assert json.loads((tmp_path / "b.json").read_text())["noise"] == {"cv": 0.3, "spike_rate": 0}
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main([*base, "--noise-cv", "-1"])
