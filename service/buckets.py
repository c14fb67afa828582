"""Fixed (batch, length) shapes: which to capture, and which one a batch of n texts of a given length uses.

Plain Python on purpose: the table is tested on the CPU, and the CUDA graph engine only consults it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from glassbox.service.types import Bucket

DEFAULT_LENGTHS = (16, 32, 64, 128, 256)
DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64)


def length_buckets(candidates: Iterable[int], max_length: int) -> tuple[int, ...]:
    """Sorted unique lengths up to max_length; max_length itself is always a bucket so every text fits."""
    lengths = sorted({n for n in candidates if 0 < n < max_length} | {max_length})
    return tuple(lengths)


def batch_buckets(candidates: Iterable[int], max_batch: int) -> tuple[int, ...]:
    """Sorted unique batch sizes up to max_batch; max_batch itself is always a bucket."""
    return tuple(sorted({n for n in candidates if 0 < n < max_batch} | {max_batch}))


class BucketTable:
    """Maps (n, length) to the smallest (batch, length) bucket that holds it, or None when none does."""

    def __init__(self, batches: Sequence[int], lengths: Sequence[int]) -> None:
        if not batches or not lengths:
            raise ValueError("a bucket table needs at least one batch size and one length")
        if min(batches) < 1 or min(lengths) < 1:
            raise ValueError(f"bucket sizes must be positive, got batches={batches}, lengths={lengths}")
        self.batches = tuple(sorted(set(batches)))
        self.lengths = tuple(sorted(set(lengths)))

    @property
    def max_batch(self) -> int:
        return self.batches[-1]

    @property
    def max_length(self) -> int:
        return self.lengths[-1]

    def all(self) -> tuple[Bucket, ...]:
        """Every bucket, largest area first: the order to capture graphs in, so that smaller graphs
        reuse the memory pool the largest one reserved."""
        every = [Bucket(b, s) for b in self.batches for s in self.lengths]
        return tuple(sorted(every, key=lambda bk: (bk.tokens, bk.batch), reverse=True))

    def lookup(self, n: int, length: int) -> Bucket | None:
        if n < 1 or length < 1:
            raise ValueError(f"a batch needs n >= 1 and length >= 1, got n={n}, length={length}")
        b = bisect.bisect_left(self.batches, n)
        s = bisect.bisect_left(self.lengths, length)
        if b == len(self.batches) or s == len(self.lengths):
            return None
        return Bucket(self.batches[b], self.lengths[s])


def padding_waste(lengths: Sequence[int], bucket: Bucket) -> float:
    """Fraction of the bucket's token slots that hold padding rather than real tokens."""
    if not lengths or min(lengths) < 1:
        raise ValueError(f"padding waste needs one or more lengths >= 1, got {list(lengths)}")
    if len(lengths) > bucket.batch or max(lengths) > bucket.length:
        raise ValueError(f"{len(lengths)} texts up to {max(lengths)} tokens do not fit bucket {bucket}")
    return 1.0 - sum(lengths) / bucket.tokens
