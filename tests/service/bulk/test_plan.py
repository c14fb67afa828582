from __future__ import annotations

import numpy as np
import pytest

from glassbox.service.bulk.plan import cut_batches


def test_batches_are_length_sorted_and_cover_every_row_once() -> None:
    lengths = np.array([30, 5, 12, 5, 60, 8, 12], dtype=np.int64)
    batches = cut_batches(lengths, max_batch=3, batch_tokens=1000)
    assert sorted(np.concatenate(batches).tolist()) == list(range(7))
    flat = np.concatenate(batches)
    assert lengths[flat].tolist() == sorted(lengths.tolist())
    assert [len(b) for b in batches] == [3, 3, 1]
    assert batches[0].tolist() == [1, 3, 5]  # equal lengths keep input order


def test_padded_area_stays_under_the_budget() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 200, size=500).astype(np.int64)
    for batch in cut_batches(lengths, max_batch=64, batch_tokens=1024):
        area = len(batch) * int(lengths[batch].max())
        assert area <= 1024 or len(batch) == 1


def test_a_text_longer_than_the_budget_runs_alone() -> None:
    batches = cut_batches(np.array([4, 500, 4], dtype=np.int64), max_batch=8, batch_tokens=100)
    assert [b.tolist() for b in batches] == [[0, 2], [1]]


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        cut_batches(np.array([1], dtype=np.int64), max_batch=0, batch_tokens=10)
