"""The pure rate helper, on hand-made counter sequences."""

from hypothesis import given
from hypothesis import strategies as st

from opsboard_agent.rates import RateTracker, counter_rates


def test_it_computes_per_second_rates():
    assert counter_rates({"rx": 100.0}, 10.0, {"rx": 300.0}, 12.0) == {"rx": 100.0}


def test_it_skips_a_counter_that_went_down():
    rates = counter_rates({"rx": 1000.0, "tx": 10.0}, 0.0, {"rx": 5.0, "tx": 30.0}, 1.0)
    assert rates == {"tx": 20.0}


def test_it_gives_nothing_for_a_non_positive_interval():
    assert counter_rates({"rx": 1.0}, 5.0, {"rx": 2.0}, 5.0) == {}
    assert counter_rates({"rx": 1.0}, 5.0, {"rx": 2.0}, 4.0) == {}


def test_it_ignores_counters_that_appear_or_vanish():
    assert counter_rates({"a": 1.0}, 0.0, {"b": 2.0}, 1.0) == {}


def test_it_resumes_from_the_value_after_a_reset():
    tracker = RateTracker()
    readings = [(0.0, 100.0), (1.0, 200.0), (2.0, 50.0), (3.0, 80.0), (4.0, 80.0)]
    rates = [tracker.update({"c": value}, ts).get("c") for ts, value in readings]
    assert rates == [None, 100.0, None, 30.0, 0.0]


@given(st.lists(st.tuples(st.floats(0.001, 100), st.floats(0, 1e15)), min_size=1, max_size=50))
def test_rates_are_never_negative(steps):
    tracker, ts = RateTracker(), 0.0
    for dt, value in steps:
        ts += dt
        for rate in tracker.update({"c": value}, ts).values():
            assert rate >= 0
