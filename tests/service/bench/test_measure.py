from __future__ import annotations

import numpy as np
import pytest

from glassbox.service.bench.measure import Passes, Variant, interleave, paired_speedup, summarize, timed_pass, warm_up
from glassbox.service.bench.mix import Batches
from glassbox.service.buckets import BucketTable
from glassbox.service.types import FloatArray, TokenBatch


def _batch(lengths: list[int]) -> TokenBatch:
    width = max(lengths)
    ids = np.zeros((len(lengths), width), dtype=np.int64)
    for row, n in enumerate(lengths):
        ids[row, :n] = np.arange(1, n + 1)
    return TokenBatch(ids=ids, lengths=np.array(lengths, dtype=np.int64), truncated=np.zeros(len(lengths), bool))


def _batches() -> Batches:
    # 6 texts in three batches; rows say which text each batch row is.
    return Batches(
        batches=(_batch([3, 5]), _batch([10, 12]), _batch([40, 20])),
        rows=(np.array([4, 0]), np.array([1, 5]), np.array([2, 3])),
        sorted=True,
    )


def _odd_length_is_positive(batch: TokenBatch) -> FloatArray:
    logits = np.zeros((batch.size, 2), dtype=np.float32)
    logits[np.arange(batch.size), batch.lengths % 2] = 1.0
    return logits


def test_timed_pass_puts_each_prediction_back_on_its_text() -> None:
    latencies, predictions = timed_pass(_odd_length_is_positive, _batches())
    assert latencies.shape == (3,) and (latencies > 0).all()
    # text index -> its length: 0:5, 1:10, 2:40, 3:20, 4:3, 5:12
    assert predictions.tolist() == [1, 0, 0, 0, 1, 0]


def test_variants_alternate_order_between_rounds() -> None:
    calls: list[str] = []

    def recorder(name: str) -> Variant:
        def run(batch: TokenBatch) -> FloatArray:
            calls.append(name)
            return _odd_length_is_positive(batch)
        return Variant(name, run)

    passes = interleave([recorder("a"), recorder("b")], _batches(), rounds=3)
    per_pass = [calls[i] for i in range(0, len(calls), 3)]
    assert per_pass == ["a", "b", "b", "a", "a", "b"]
    assert [len(p.latencies_ns) for p in passes.values()] == [3, 3]


def test_warm_up_touches_a_spread_of_batches() -> None:
    seen: list[int] = []

    def run(batch: TokenBatch) -> FloatArray:
        seen.append(batch.max_length)
        return _odd_length_is_positive(batch)

    warm_up(run, _batches(), count=2)
    assert seen == [5, 40]  # the first and the last batch


def test_summary_figures_follow_from_the_latencies() -> None:
    ms = 1_000_000
    passes = Passes(
        latencies_ns=(np.array([10 * ms, 20 * ms, 70 * ms]), np.array([10 * ms, 20 * ms, 170 * ms])),
        predictions=np.array([1, 0, 0, 0, 1, 0]),
    )
    table = BucketTable([1, 2, 4], [16, 32, 64])
    summary = summarize(passes, _batches(), table, labels=np.array([1, 0, 1, 1, 1, 0]))
    assert summary["throughput_per_pass"] == [6 / 0.1, 6 / 0.2]
    assert summary["throughput_seq_per_s"] == pytest.approx(45.0)
    assert summary["accuracy"] == pytest.approx(4 / 6, abs=1e-4)
    assert list(summary["buckets"]) == ["2x16", "2x64"]  # (2 texts, 12 tokens) also lands in 2x16
    assert summary["buckets"]["2x16"]["batches"] == 2 and summary["buckets"]["2x16"]["texts"] == 4
    assert summary["buckets"]["2x16"]["p50_ms"] == pytest.approx(15.0)
    assert summary["buckets"]["2x64"]["p50_ms"] == pytest.approx(120.0)
    assert summary["buckets"]["2x64"]["seq_per_s"] == pytest.approx(4 / 0.24, abs=0.1)
    assert summary["latency_ms"]["p50"] == pytest.approx(20.0)  # of 10, 20, 70, 10, 20, 170
    assert summary["latency_ms"]["p99"] <= 170.0
    assert summary["padding_ratio"] == pytest.approx(1 - 90 / 114, abs=1e-4)
    assert summary["mean_tokens"] == 15.0


def test_summary_without_labels_has_no_accuracy() -> None:
    passes = Passes(latencies_ns=(np.array([1, 2, 3]),), predictions=np.zeros(6, dtype=np.int64))
    assert summarize(passes, _batches(), BucketTable([2], [64]), labels=None)["accuracy"] is None


def test_paired_speedup_is_the_median_of_round_ratios() -> None:
    slow = Passes((np.array([100]), np.array([300]), np.array([100])), np.zeros(1, dtype=np.int64))
    fast = Passes((np.array([50]), np.array([100]), np.array([100])), np.zeros(1, dtype=np.int64))
    assert paired_speedup(slow, fast) == 2.0  # ratios 2, 3, 1
