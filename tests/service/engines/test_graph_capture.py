"""CudaGraphCapturer's bookkeeping on the CPU, through a double of torch.cuda (fake_cuda.py): one stream for every
warm-up and capture, the same pool for every graph, memory_reserved logged at each step, the SDPA backend named."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from glassbox.service.buckets import BucketTable
from glassbox.service.engines.graph_capture import CudaGraphCapturer, EagerRehearsalCapturer
from glassbox.service.engines.graphs import CudaGraphEngine
from glassbox.service.model.bert import BertClassifier
from tests.service.engines.fake_cuda import MIB, FakeCuda
from tests.service.engines.graph_fixtures import model, one_thread
from tests.service.engines.test_graphs import token_batch

TABLE = BucketTable(batches=(1, 2, 4), lengths=(8, 16))
__all__ = ["model", "one_thread"]  # fixtures, used by name


def faked_engine(model: BertClassifier) -> tuple[CudaGraphEngine, CudaGraphCapturer, FakeCuda]:
    cuda = FakeCuda()
    capturer = CudaGraphCapturer(torch.device("cuda:0"), cuda=cuda)
    # The model stays on the CPU: only the capturer believes in CUDA.
    return CudaGraphEngine(model, "cpu", "fp32", TABLE, capturer=capturer), capturer, cuda


def test_one_stream_serves_every_warm_up_and_every_capture(model: BertClassifier) -> None:
    engine, capturer, cuda = faked_engine(model)
    engine.warmup()
    count = len(TABLE.all())
    assert capturer.streams_created == 1 and len(cuda.created) == 1
    (side,) = cuda.created
    assert [what for what, _ in capturer.stream_uses] == ["warm"] * count + ["capture"] * count
    assert {handle for _, handle in capturer.stream_uses} == {side.cuda_stream}
    assert side.cuda_stream != cuda.default.cuda_stream
    # torch.cuda.graph was handed that stream and one shared pool, every time.
    assert [call["stream"] for call in cuda.graph_calls] == [side] * count
    assert {call["pool"] for call in cuda.graph_calls} == {("pool", 1)}
    assert all(call["capture_error_mode"] == "thread_local" for call in cuda.graph_calls)
    # The side stream waited for the current (default) stream before each warm-up, as the capture recipe asks.
    assert side.waited_on == [cuda.default.cuda_stream] * count


def test_memory_reserved_is_read_and_logged_before_and_after_warm_up_and_capture(
    model: BertClassifier, caplog: pytest.LogCaptureFixture
) -> None:
    engine, _, cuda = faked_engine(model)
    with caplog.at_level(logging.INFO, logger="glassbox.graphs"):
        engine.warmup()
    capture = engine.stats().capture
    assert capture is not None
    # The fake's reading grows by 1 MiB per call: three readings, in warm-up order.
    assert (capture.reserved_before_warmup_bytes, capture.reserved_after_warmup_bytes,
            capture.reserved_after_capture_bytes) == (1 * MIB, 2 * MIB, 3 * MIB)
    assert capture.pool_reserved_bytes == 1 * MIB
    (line,) = [r.getMessage() for r in caplog.records if "graphs captured" in r.getMessage()]
    assert "memory_reserved 1.0 MiB before warm-up, 2.0 MiB after it, 3.0 MiB after capture" in line
    assert f"SDPA backend for the padded buckets: {capture.sdpa_backend}" in line
    assert capture.sdpa_backend and capture.sdpa_backend != "unknown"
    assert cuda.empties == 2  # settle() after warm-up and after capture


def test_the_capturer_touches_no_cuda_state_until_warm_up() -> None:
    cuda = FakeCuda()
    capturer = CudaGraphCapturer(torch.device("cuda:0"), cuda=cuda)
    assert capturer.streams_created == 0 and not cuda.created and cuda.pools == 0
    with pytest.raises(ValueError, match="need a CUDA device"):
        CudaGraphCapturer(torch.device("cpu"), cuda=cuda)


def test_replayed_logits_are_cast_on_the_host_into_fresh_arrays(model: BertClassifier) -> None:
    engine = CudaGraphEngine(model, "cpu", "fp16", TABLE, capturer=EagerRehearsalCapturer())
    engine.warmup()
    batch = token_batch([5, 3], model.config.vocab_size, seed=1)
    first = engine.run(batch)
    assert first.timing.mode == "graph" and first.logits.dtype == np.float32
    host = engine._host_logits
    assert host.dtype == torch.float16  # the staging buffer keeps the model's dtype
    # Exactly the fp16 values, widened: the cast added nothing and lost nothing.
    np.testing.assert_array_equal(first.logits, host[:2].float().numpy())
    kept = first.logits.copy()
    engine.run(token_batch([5, 3], model.config.vocab_size, seed=2))
    np.testing.assert_array_equal(first.logits, kept)  # not a view of the staging buffer


def test_padded_eager_reference_equals_the_rehearsed_replay_bit_for_bit(model: BertClassifier) -> None:
    engine = CudaGraphEngine(model, "cpu", "fp32", TABLE, capturer=EagerRehearsalCapturer())
    engine.warmup()
    for seed, lengths in enumerate(([3], [7, 2], [16, 9, 1, 4])):
        batch = token_batch(lengths, model.config.vocab_size, seed=seed)
        assert engine.replays(batch)
        np.testing.assert_array_equal(engine.run(batch).logits, engine.run_padded_eager(batch))
    too_many = token_batch([4] * 5, model.config.vocab_size)
    assert not engine.replays(too_many)
    with pytest.raises(ValueError, match="fits no bucket"):
        engine.run_padded_eager(too_many)


# ---- on a real device (scripts/gpu-check.sh runs these; skipped without CUDA) ------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_real_capture_uses_one_side_stream(model: BertClassifier) -> None:
    capturer = CudaGraphCapturer(torch.device("cuda:0"))
    engine = CudaGraphEngine(model, "cuda:0", "fp16", TABLE, capturer=capturer)
    engine.warmup()
    handles = {handle for _, handle in capturer.stream_uses}
    assert capturer.streams_created == 1 and handles == {capturer.stream.cuda_stream}
    assert torch.cuda.default_stream(0).cuda_stream not in handles


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_real_replay_equals_the_same_model_run_eagerly_on_the_same_bucket(model: BertClassifier, dtype: str) -> None:
    engine = CudaGraphEngine(model, "cuda:0", dtype, TABLE)  # type: ignore[arg-type]
    engine.warmup()
    for seed, lengths in enumerate(([3], [7, 2], [16, 9, 1, 4])):
        batch = token_batch(lengths, model.config.vocab_size, seed=seed)
        np.testing.assert_array_equal(engine.run(batch).logits, engine.run_padded_eager(batch))
