"""The CUDA graph engine, end to end on the CPU through the rehearsal capturer, and on a GPU when there is one.

The CPU tests drive the real CudaGraphEngine; only the capture/replay calls are replaced (graph_capture.py).
The gpu-marked tests are the only ones that exercise real torch.cuda graphs; scripts/gpu-check.sh runs them.
This module builds its own tiny model (no conftest fixtures) so the GPU check can run it with --noconftest.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from glassbox.service.buckets import BucketTable
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.engines.graph_capture import EagerRehearsalCapturer
from glassbox.service.engines.graphs import CudaGraphEngine
from glassbox.service.errors import EngineError
from glassbox.service.model.bert import BertClassifier
from glassbox.service.model.loader import load_model
from glassbox.service.types import Bucket, TokenBatch
from tests.service.engines.graph_fixtures import model, one_thread

__all__ = ["model", "one_thread"]  # fixtures, used by name

TABLE = BucketTable(batches=(1, 2, 4, 8), lengths=(8, 16, 32))


def token_batch(lengths: list[int], vocab: int, seed: int = 0) -> TokenBatch:
    rng = np.random.default_rng(seed)
    width = max(lengths)
    ids = np.zeros((len(lengths), width), dtype=np.int64)  # [n, width], pad id 0
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(5, vocab, size=length)
    return TokenBatch(ids=ids, lengths=np.array(lengths, dtype=np.int64),
                      truncated=np.zeros(len(lengths), dtype=np.bool_))


def rehearsal_engine(model: BertClassifier, table: BucketTable = TABLE, **kwargs: object) -> CudaGraphEngine:
    return CudaGraphEngine(model, "cpu", "fp32", table, capturer=EagerRehearsalCapturer(), **kwargs)  # type: ignore[arg-type]


SHAPES = [[1], [3], [8, 2], [16, 16, 16], [5, 9, 1, 30], [32] * 8, [2, 4, 6, 8, 10, 12, 14]]


@pytest.mark.parametrize("lengths", SHAPES, ids=str)
def test_graph_logits_equal_eager_logits(model: BertClassifier, lengths: list[int]) -> None:
    graph = rehearsal_engine(model)
    graph.warmup()
    eager = EagerEngine(model, "cpu", "fp32")
    batch = token_batch(lengths, model.config.vocab_size, seed=len(lengths))
    got = graph.run(batch)
    want = eager.run(batch)
    assert got.timing.mode == "graph"
    assert got.logits.shape == want.logits.shape == (len(lengths), model.config.num_labels)
    assert got.logits.dtype == np.float32
    np.testing.assert_allclose(got.logits, want.logits, rtol=0, atol=1e-5)


def test_bucket_choice_matches_the_table_for_every_fitting_shape(model: BertClassifier) -> None:
    engine = rehearsal_engine(model)
    engine.warmup()
    expected: dict[Bucket, int] = {}
    for n in range(1, TABLE.max_batch + 1):
        for width in (1, 7, 8, 9, 16, 17, 32):
            result = engine.run(token_batch([width] * n, model.config.vocab_size))
            bucket = TABLE.lookup(n, width)
            assert bucket is not None
            assert result.timing.bucket == bucket
            assert result.timing.padded_tokens == bucket.tokens
            assert result.timing.rows == n and result.timing.real_tokens == n * width
            expected[bucket] = expected.get(bucket, 0) + 1
    stats = engine.stats()
    assert dict(stats.replays) == expected
    assert stats.eager_fallbacks_total == 0


@pytest.mark.parametrize(
    ("lengths", "reason"),
    [
        ([4] * 9, "batch_above_buckets"),
        ([33, 2], "length_above_buckets"),
        ([40] * 12, "batch_and_length_above_buckets"),
    ],
)
def test_shapes_beyond_the_buckets_run_eagerly_and_are_counted(
    model: BertClassifier, lengths: list[int], reason: str
) -> None:
    engine = rehearsal_engine(model)
    engine.warmup()
    batch = token_batch(lengths, model.config.vocab_size)
    result = engine.run(batch)
    engine.run(batch)
    assert result.timing.mode == "eager" and result.timing.bucket is None
    assert result.timing.padded_tokens == len(lengths) * max(lengths)
    np.testing.assert_allclose(result.logits, EagerEngine(model).run(batch).logits, rtol=0, atol=1e-5)
    stats = engine.stats()
    assert dict(stats.eager_fallbacks) == {reason: 2}
    assert stats.replays_total == 0


def test_warmup_warms_everything_then_captures_largest_first_in_inference_mode(model: BertClassifier) -> None:
    capturer = EagerRehearsalCapturer()
    engine = CudaGraphEngine(model, "cpu", "fp32", TABLE, capturer=capturer)
    report = engine.warmup()
    buckets = TABLE.all()
    assert report.buckets == buckets and report.kind == "graph-rehearsal-fp32" and report.device == "cpu"
    assert report.graph_pool_bytes == 0  # the rehearsal has no pool; only a GPU run measures one
    count = len(buckets)
    assert capturer.log == ["warm"] * count + ["settle"] + ["capture"] * count + ["settle"]
    assert capturer.capture_in_inference_mode == [True] * count
    assert [tuple(g.output.shape) for g in capturer.graphs] == [(b.batch, model.config.num_labels) for b in buckets]
    capture = engine.stats().capture
    assert capture is not None and capture.buckets == buckets and capture.seconds >= 0
    assert engine.warmup() is report  # idempotent: a second call captures nothing new
    assert capturer.log.count("capture") == count


def test_replay_runs_through_the_captured_graph_on_static_buffers(model: BertClassifier) -> None:
    capturer = EagerRehearsalCapturer()
    engine = CudaGraphEngine(model, "cpu", "fp32", TABLE, capturer=capturer)
    engine.warmup()
    engine.run(token_batch([5, 3], model.config.vocab_size))
    replayed = [g for g in capturer.graphs if g.replays]
    assert len(replayed) == 1 and replayed[0].replays == 1
    assert replayed[0] is capturer.graphs[TABLE.all().index(Bucket(2, 8))]
    assert capturer.log[-1] == "replay"


def test_returned_logits_do_not_alias_the_static_output(model: BertClassifier) -> None:
    engine = rehearsal_engine(model)
    engine.warmup()
    first = engine.run(token_batch([6, 6], model.config.vocab_size, seed=1))
    kept = first.logits.copy()
    engine.run(token_batch([6, 6], model.config.vocab_size, seed=2))  # same bucket, different tokens
    np.testing.assert_array_equal(first.logits, kept)


def test_debug_mode_sees_buffers_stay_put_across_runs(model: BertClassifier) -> None:
    engine = rehearsal_engine(model, debug_buffers=True)
    engine.warmup()
    addresses = engine._buffers.addresses()
    for seed, lengths in enumerate(SHAPES * 3):
        engine.run(token_batch(lengths, model.config.vocab_size, seed=seed))
    assert engine._buffers.addresses() == addresses


def test_debug_mode_fails_the_run_when_a_static_buffer_moves(model: BertClassifier) -> None:
    engine = rehearsal_engine(model, debug_buffers=True)
    engine.warmup()
    engine._buffers.mask = engine._buffers.mask.clone()  # what a careless "reallocate" would do
    with pytest.raises(EngineError, match=r"moved \(mask\)"):
        engine.run(token_batch([3], model.config.vocab_size))


def test_without_debug_mode_addresses_are_not_checked(model: BertClassifier) -> None:
    engine = rehearsal_engine(model, debug_buffers=False)
    engine.warmup()
    engine._buffers.mask = engine._buffers.mask.clone()
    assert engine.run(token_batch([3], model.config.vocab_size)).timing.mode == "graph"


def test_run_before_warmup_is_an_error_and_health_says_why(model: BertClassifier) -> None:
    engine = rehearsal_engine(model)
    assert not engine.health().ok and "not captured" in engine.health().detail
    with pytest.raises(EngineError, match="before warmup"):
        engine.run(token_batch([3], model.config.vocab_size))
    engine.warmup()
    engine.run(token_batch([3], model.config.vocab_size))
    health = engine.health()
    assert health.ok and health.kind == "graph-rehearsal-fp32"
    assert f"{len(TABLE.all())} graphs; 1 replays, 0 eager fallbacks" == health.detail


def test_stats_are_snapshots(model: BertClassifier) -> None:
    engine = rehearsal_engine(model)
    engine.warmup()
    before = engine.stats()
    engine.run(token_batch([3], model.config.vocab_size))
    assert before.replays_total == 0 and engine.stats().replays_total == 1
    with pytest.raises(TypeError):
        before.replays[Bucket(1, 8)] = 5  # type: ignore[index]


@pytest.mark.parametrize(("dtype", "atol"), [("fp16", 1e-2), ("bf16", 5e-2)])
def test_half_precision_engine_leaves_the_callers_model_alone(
    model: BertClassifier, dtype: str, atol: float
) -> None:
    engine = CudaGraphEngine(model, "cpu", dtype, TABLE, capturer=EagerRehearsalCapturer())  # type: ignore[arg-type]
    engine.warmup()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    batch = token_batch([5, 9, 2], model.config.vocab_size)
    np.testing.assert_allclose(engine.run(batch).logits, EagerEngine(model).run(batch).logits, rtol=0, atol=atol)


def test_cpu_device_needs_an_explicit_capturer(model: BertClassifier) -> None:
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        CudaGraphEngine(model, "cpu", "fp32", TABLE)


def test_buckets_longer_than_the_position_table_are_refused(model: BertClassifier) -> None:
    too_long = BucketTable(batches=(1,), lengths=(model.config.max_position_embeddings + 1,))
    with pytest.raises(ValueError, match="exceeds the model's"):
        rehearsal_engine(model, too_long)


# ---- real CUDA graphs: only these prove capture and replay work -----------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("dtype", "atol"), [("fp32", 1e-4), ("fp16", 1e-2)])
def test_cuda_graphs_match_eager_cuda(model: BertClassifier, dtype: str, atol: float) -> None:
    engine = CudaGraphEngine(model, "cuda:0", dtype, TABLE, debug_buffers=True)  # type: ignore[arg-type]
    report = engine.warmup()
    assert report.kind == f"graph-{dtype}" and report.buckets == TABLE.all()
    assert report.graph_pool_bytes > 0
    assert next(model.parameters()).device.type == "cpu"  # the caller's model was copied, not moved
    eager = EagerEngine(model, "cuda:0", dtype)  # type: ignore[arg-type]
    for seed, lengths in enumerate(SHAPES * 2):
        batch = token_batch(lengths, model.config.vocab_size, seed=seed)
        got = engine.run(batch)
        assert got.timing.mode == "graph" and got.timing.bucket == TABLE.lookup(len(lengths), max(lengths))
        np.testing.assert_allclose(got.logits, eager.run(batch).logits, rtol=0, atol=atol)
    fallback = engine.run(token_batch([4] * 9, model.config.vocab_size))
    assert fallback.timing.mode == "eager"
    stats = engine.stats()
    assert stats.replays_total == 2 * len(SHAPES) and dict(stats.eager_fallbacks) == {"batch_above_buckets": 1}


@pytest.mark.gpu
@needs_cuda
def test_cuda_replay_sees_new_inputs(model: BertClassifier) -> None:
    engine = CudaGraphEngine(model, "cuda:0", "fp32", TABLE, debug_buffers=True)
    engine.warmup()
    a = engine.run(token_batch([7, 7], model.config.vocab_size, seed=1)).logits
    b = engine.run(token_batch([7, 7], model.config.vocab_size, seed=2)).logits
    assert not np.allclose(a, b)  # a stale replay would return the same logits twice


def test_the_graph_engine_runs_its_private_copy_padded(tiny_model_dir: Path) -> None:
    """Packing real tokens depends on the data; a captured graph replays fixed shapes, so the copy must not pack."""
    from glassbox.service.engines.graphs import prepare_model

    model = load_model(tiny_model_dir).model
    private = prepare_model(model, torch.device("cpu"), torch.float32)
    assert model.unpad and not private.unpad  # type: ignore[union-attr]
