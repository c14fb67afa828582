"""benchmarks/telemetry_overhead.py: the paired throughput loss, and the interval saying what its rounds resolve."""

from __future__ import annotations

import pytest

from benchmarks.telemetry_overhead import paired_loss


def test_the_loss_is_paired_per_round_with_an_interval_around_its_median() -> None:
    on = [99.0, 90.0, 110.0, 96.0, 100.0]
    off = [100.0, 100.0, 100.0, 100.0, 100.0]
    loss = paired_loss(on, off)
    assert loss["throughput_loss_rounds"] == pytest.approx([-0.10, 0.0, 0.01, 0.04, 0.10])
    assert loss["throughput_loss_median_of_rounds"] == pytest.approx(0.01)
    low, high = loss["throughput_loss_median_ci95"]
    assert -0.10 - 1e-9 <= low <= 0.01 <= high <= 0.10 + 1e-9
    assert high - low > 0.02  # five rounds this far apart cannot pin the median to within a point either way


def test_rounds_that_agree_give_a_narrow_interval() -> None:
    loss = paired_loss([95.0, 95.1, 94.9, 95.0, 95.05, 94.95], [100.0] * 6)
    low, high = loss["throughput_loss_median_ci95"]
    assert 0.049 <= low <= high <= 0.051

