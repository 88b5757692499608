"""The before/after verdict of `zlog bench compare` (pyzlog.bench.compare):
an interval for the median of the paired per-round ratios, from their order
alone, and "slower" only when all of it lies below 1."""
from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyzlog.bench.compare import median_interval, verdict


def test_five_rounds_give_no_interval_and_six_give_min_to_max() -> None:
    assert median_interval([0.9, 0.91, 0.92, 0.93, 0.94]) is None
    assert verdict([0.9, 0.91, 0.92, 0.93, 0.94]) == "too few rounds"
    low, high, coverage = median_interval([0.97, 0.9, 0.93, 0.95, 0.91, 0.98])  # type: ignore[misc]
    assert (low, high) == (0.9, 0.98)
    assert coverage == pytest.approx(1 - 2 / 64)


def test_ten_rounds_drop_one_round_at_each_end() -> None:
    ratios = [0.95, 1.03, 1.21, 1.02, 1.07, 0.92, 1.02, 0.98, 0.97, 1.03]
    low, high, coverage = median_interval(ratios)  # type: ignore[misc]
    assert (low, high) == (0.95, 1.07)
    assert coverage == pytest.approx(1 - 2 * 11 / 1024)
    assert verdict(ratios) == "no difference shown"


def test_a_case_is_slower_or_faster_only_when_every_round_in_the_interval_agrees() -> None:
    assert verdict([0.93, 0.98, 0.94, 0.95, 0.91, 0.97]) == "slower"
    assert verdict([1.09, 1.19, 1.01, 1.11, 1.07, 1.02]) == "faster"
    assert verdict([1.09, 1.19, 0.94, 1.11, 1.07, 1.0]) == "no difference shown"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.1, 10.0), min_size=6, max_size=60))
def test_the_interval_holds_the_sample_median_and_reaches_the_level(ratios: list[float]) -> None:
    interval = median_interval(ratios)
    assert interval is not None
    low, high, coverage = interval
    s = sorted(ratios)
    n = len(s)
    median = (s[(n - 1) // 2] + s[n // 2]) / 2
    assert low <= median <= high
    assert 0.95 <= coverage <= 1


def test_the_interval_covers_the_true_median_as_often_as_it_says() -> None:
    """Rounds drawn from a skewed distribution whose median is 1: a 'slower'
    or 'faster' verdict is a false alarm, and happens at most 5% of the time."""
    rnd = random.Random(7)
    trials, alarms = 2000, 0
    for _ in range(trials):
        ratios = [math.exp(rnd.gauss(0, 0.1)) ** (3 if rnd.random() < 0.5 else 1) for _ in range(8)]
        alarms += verdict(ratios) in ("slower", "faster")
    assert alarms / trials <= 0.05
