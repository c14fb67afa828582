"""The engine cost model: a fixed part per batch and a part per token, fitted to the batches that ran."""

from __future__ import annotations

import random

import pytest

from glassbox.service.batching.cost import Cost, CostModel

MS = 1_000_000


def test_nothing_ran_means_no_cost() -> None:
    assert CostModel().cost is None


def test_batches_of_different_sizes_separate_the_fixed_part_from_the_per_token_part() -> None:
    model = CostModel()
    for tokens in (27, 54, 108, 216, 432, 27, 216):
        model.record("cpu", tokens, int(5 * MS + tokens * 0.1 * MS))  # 5 ms + 0.1 ms a token, exactly
    cost = model.cost
    assert cost is not None
    assert cost.fixed_ns == pytest.approx(5 * MS, rel=1e-6)
    assert cost.per_token_ns == pytest.approx(0.1 * MS, rel=1e-6)
    assert cost.batch_ns(100) == pytest.approx(15 * MS, rel=1e-6)


def test_batches_all_of_one_size_put_the_whole_cost_on_the_tokens() -> None:
    model = CostModel()
    for _ in range(10):
        model.record("cpu", 100, 20 * MS)
    assert model.cost == Cost(0.0, 0.2 * MS)


def test_an_impossible_fit_falls_back_to_the_per_token_rate() -> None:
    model = CostModel()
    # bigger batches were faster (noise): a negative slope is not a cost
    for tokens, ms in ((20, 30), (40, 25), (80, 20), (160, 15)):
        model.record("cpu", tokens, ms * MS)
    cost = model.cost
    assert cost is not None and cost.fixed_ns == 0.0 and cost.per_token_ns > 0


def test_the_window_restarts_when_the_device_changes() -> None:
    model = CostModel()
    for tokens in (10, 100, 1000, 10, 100):
        model.record("cuda:0", tokens, int(1 * MS + tokens * 1000))
    model.record("cpu", 100, 50 * MS)
    assert model.device == "cpu" and model.cost == Cost(0.0, 0.5 * MS)


def test_the_window_keeps_only_recent_batches() -> None:
    model = CostModel(window=4)
    for _ in range(4):
        model.record("cpu", 100, 100 * MS)  # slow, long ago
    for _ in range(4):
        model.record("cpu", 100, 10 * MS)
    assert model.cost == Cost(0.0, 0.1 * MS)
    with pytest.raises(ValueError):
        CostModel(window=1)


def test_a_change_of_speed_restarts_the_window_after_a_run_of_batches_off_the_fit() -> None:
    model = CostModel(window=64, shift_run=4)
    for tokens in (20, 40, 80, 160) * 10:  # a slow spell: 100 ms a batch + 0.1 ms a token
        model.record("cpu", tokens, int(100 * MS + tokens * 0.1 * MS))
    for tokens in (20, 40, 80):  # back to 5 ms a batch: three batches are not yet a run
        model.record("cpu", tokens, int(5 * MS + tokens * 0.1 * MS))
    cost = model.cost
    assert cost is not None and cost.fixed_ns > 50 * MS
    model.record("cpu", 160, int(5 * MS + 160 * 0.1 * MS))  # the fourth: the window restarts from the run
    cost = model.cost
    assert cost is not None
    assert cost.fixed_ns == pytest.approx(5 * MS, rel=1e-6) and cost.per_token_ns == pytest.approx(0.1 * MS, rel=1e-6)


def test_one_outlier_does_not_restart_the_window() -> None:
    model = CostModel(window=64, shift_run=4)
    for tokens in (20, 40, 80, 160) * 5:
        model.record("cpu", tokens, int(5 * MS + tokens * 0.1 * MS))
    for slow in (True, False, True, False, True):  # slow batches, but never four in a row
        model.record("cpu", 40, int((200 if slow else 9) * MS))
    assert len(model._samples) == 25  # nothing was dropped
    with pytest.raises(ValueError):
        CostModel(shift_run=1)


def _direct_fit(samples: list[tuple[float, float]]) -> Cost:
    """The least-squares fit computed afresh from the samples, two passes, as a reference for the running sums."""
    n = len(samples)
    mean_x = sum(x for x, _ in samples) / n
    mean_y = sum(y for _, y in samples) / n
    var_x = sum((x - mean_x) ** 2 for x, _ in samples)
    if n >= 4 and var_x > n * 16.0:
        slope = sum((x - mean_x) * (y - mean_y) for x, y in samples) / var_x
        intercept = mean_y - slope * mean_x
        if slope > 0 and intercept >= 0:
            return Cost(intercept, slope)
    return Cost(0.0, mean_y / mean_x)


def test_the_running_fit_matches_a_fresh_fit_of_the_window_over_a_long_run() -> None:
    """Thousands of batches (the running sums are recomputed every few hundred changes), noisy sizes and times, and a
    device change on the way: after every batch the cost equals the fit of the last `window` batches on the device
    computed from scratch. (A change of speed restarting the window is covered above.)"""
    rng = random.Random(7)
    model = CostModel(window=64, shift_factor=1000.0)  # noise never counts as a change of speed here
    kept: list[tuple[float, float]] = []
    for step in range(3000):
        device = "cuda:0" if step < 1000 else "cpu"
        if step == 1000:
            kept = []
        tokens = rng.randint(1, 4000)
        busy = int(5 * MS + tokens * 0.05 * MS * rng.uniform(0.7, 1.3))
        model.record(device, tokens, busy)
        kept = [*kept, (float(tokens), float(busy))][-64:]
        cost, expected = model.cost, _direct_fit(kept)
        assert cost is not None
        assert cost.fixed_ns == pytest.approx(expected.fixed_ns, rel=1e-6, abs=1.0)
        assert cost.per_token_ns == pytest.approx(expected.per_token_ns, rel=1e-9)
