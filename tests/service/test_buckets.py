"""Bucket table properties: the smallest fitting bucket, None beyond the table, capture order, padding waste."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from glassbox.service.buckets import (
    DEFAULT_BATCHES,
    DEFAULT_LENGTHS,
    BucketTable,
    batch_buckets,
    length_buckets,
    padding_waste,
)
from glassbox.service.types import Bucket

sizes = st.lists(st.integers(min_value=1, max_value=512), min_size=1, max_size=8)
tables = st.builds(BucketTable, sizes, sizes)


@given(tables, st.integers(1, 600), st.integers(1, 600))
def test_lookup_returns_the_smallest_bucket_that_fits(table: BucketTable, n: int, length: int) -> None:
    found = table.lookup(n, length)
    fitting = [b for b in table.all() if b.batch >= n and b.length >= length]
    if found is None:
        assert not fitting
        assert n > table.max_batch or length > table.max_length
        return
    assert found in table.all()
    assert found.batch >= n and found.length >= length
    # No bucket of the table that fits is smaller in either dimension, hence none has a smaller area.
    assert all(b.batch >= found.batch and b.length >= found.length for b in fitting)
    assert found.tokens == min(b.tokens for b in fitting)


@given(tables)
def test_everything_up_to_the_largest_bucket_fits(table: BucketTable) -> None:
    assert table.lookup(table.max_batch, table.max_length) == Bucket(table.max_batch, table.max_length)
    assert table.lookup(1, 1) == Bucket(min(table.batches), min(table.lengths))
    assert table.lookup(table.max_batch + 1, 1) is None
    assert table.lookup(1, table.max_length + 1) is None


@given(tables)
def test_all_is_complete_unique_and_largest_first(table: BucketTable) -> None:
    every = table.all()
    assert set(every) == {Bucket(b, s) for b in table.batches for s in table.lengths}
    assert len(every) == len(set(every)) == len(table.batches) * len(table.lengths)
    areas = [b.tokens for b in every]
    assert areas == sorted(areas, reverse=True)
    assert every[0] == Bucket(table.max_batch, table.max_length)


@given(st.lists(st.integers(1, 256), min_size=1, max_size=64), st.integers(0, 64), st.integers(0, 64))
def test_padding_waste_is_the_share_of_empty_slots(lengths: list[int], extra_rows: int, extra_width: int) -> None:
    bucket = Bucket(len(lengths) + extra_rows, max(lengths) + extra_width)
    waste = padding_waste(lengths, bucket)
    assert 0.0 <= waste < 1.0
    assert waste == pytest.approx(1 - sum(lengths) / (bucket.batch * bucket.length))
    if extra_rows == 0 and extra_width == 0 and len(set(lengths)) == 1:
        assert waste == 0.0


def test_padding_waste_refuses_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        padding_waste([3, 3, 3], Bucket(2, 16))
    with pytest.raises(ValueError, match="do not fit"):
        padding_waste([17], Bucket(2, 16))
    with pytest.raises(ValueError, match="lengths >= 1"):
        padding_waste([], Bucket(2, 16))
    with pytest.raises(ValueError, match="lengths >= 1"):
        padding_waste([0, 4], Bucket(2, 16))


@given(st.lists(st.integers(-5, 600)), st.integers(1, 512))
def test_length_and_batch_buckets_are_sorted_bounded_and_include_the_max(candidates: list[int], top: int) -> None:
    for make in (length_buckets, batch_buckets):
        result = make(candidates, top)
        assert result[-1] == top
        assert list(result) == sorted(set(result))
        assert all(0 < b <= top for b in result)
        assert set(result) == {c for c in candidates if 0 < c < top} | {top}


def test_defaults_match_the_design() -> None:
    assert length_buckets(DEFAULT_LENGTHS, 256) == (16, 32, 64, 128, 256)
    assert length_buckets(DEFAULT_LENGTHS, 100) == (16, 32, 64, 100)
    assert batch_buckets(DEFAULT_BATCHES, 32) == (1, 2, 4, 8, 16, 32)
    table = BucketTable(batch_buckets(DEFAULT_BATCHES, 64), length_buckets(DEFAULT_LENGTHS, 256))
    assert table.lookup(3, 17) == Bucket(4, 32)
    assert table.lookup(64, 256) == Bucket(64, 256)
    assert table.lookup(65, 10) is None
    assert table.lookup(1, 257) is None


def test_bad_tables_and_lookups_are_refused() -> None:
    with pytest.raises(ValueError):
        BucketTable([], [16])
    with pytest.raises(ValueError):
        BucketTable([1, 2], [])
    with pytest.raises(ValueError, match="positive"):
        BucketTable([0, 2], [16])
    table = BucketTable([1, 2], [16])
    with pytest.raises(ValueError):
        table.lookup(0, 4)
    with pytest.raises(ValueError):
        table.lookup(1, 0)
