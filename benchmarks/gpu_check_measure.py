"""One (model, dtype) of the GPU check: capture, exact and cross-path parity, graph-vs-eager latency, the overflow
count, the single capture stream and, for the BERT-base-sized model in fp16, throughput per bucket. Results go into
the named checks of the CheckBook (gpu_check_book.py) and into the run's own JSON.

Imports only what the bare GPU machine has (torch, numpy, tokenizers, safetensors): no starlette, msgspec,
uvicorn or opentelemetry. Everything returned is plain JSON-ready data.
"""

from __future__ import annotations

import copy
import gc
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from benchmarks.gpu_check_book import CheckBook
from glassbox.service.buckets import BucketTable
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.engines.graph_capture import Capturer, CudaGraphCapturer
from glassbox.service.engines.graphs import CudaGraphEngine
from glassbox.service.model.bert import BertClassifier
from glassbox.service.types import TokenBatch

Dtype = Literal["fp32", "fp16"]
# Cross-path parity compares softmax probabilities, |p_graph - p_eager| <= atol + rtol * p_eager: graph and eager
# run different kernels on different shapes (the graph pads to its bucket), so only a tolerance is fair; the
# exact check is graph_parity_exact.
PROB_RTOL: dict[str, float] = {"fp32": 1e-4, "fp16": 2e-2}
PROB_ATOL: dict[str, float] = {"fp32": 1e-6, "fp16": 1e-3}
LATENCY_SHAPES = ((1, 128), (32, 128))  # (batch, length), as issue 2 asks
THROUGHPUT_WARM, THROUGHPUT_RUNS = 3, 20


@dataclass(frozen=True)
class Plan:
    device: str
    table: BucketTable
    iterations: int  # timed runs per (shape, mode)
    warm_runs: int  # untimed runs before them


def random_batch(lengths: list[int], vocab: int, rng: np.random.Generator) -> TokenBatch:
    ids = np.zeros((len(lengths), max(lengths)), dtype=np.int64)  # [n, longest], pad id 0
    low = min(1000, vocab // 2)  # above the special tokens of a real vocabulary
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(low, vocab, size=length)
    return TokenBatch(ids=ids, lengths=np.asarray(lengths, dtype=np.int64),
                      truncated=np.zeros(len(lengths), dtype=np.bool_))


def parity_batches(table: BucketTable, vocab: int) -> list[tuple[str, TokenBatch]]:
    """Full rows at the latency shapes, ragged rows that leave padding inside a bucket, a lone short text."""
    rng = np.random.default_rng(0)
    top = table.max_length
    shapes = {
        "1x128 full": [min(128, top)],
        "32x128 full": [min(128, top)] * min(32, table.max_batch),
        "5 ragged": rng.integers(2, min(120, top) + 1, size=5).tolist(),
        "17 ragged": rng.integers(2, top + 1, size=min(17, table.max_batch)).tolist(),
        "3 short": [3, 9, 16],
    }
    return [(name, random_batch(lengths, vocab, rng)) for name, lengths in shapes.items()]


def percentiles(samples_s: list[float]) -> dict[str, float]:
    ms = np.asarray(samples_s) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()), "runs": len(samples_s)}


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)  # [n, labels]
    exp = np.exp(shifted)
    probabilities: np.ndarray = exp / exp.sum(axis=1, keepdims=True)
    return probabilities


def check_parity(graph: CudaGraphEngine, eager: EagerEngine, dtype: str, vocab: int, book: CheckBook,
                 where: dict[str, Any]) -> dict[str, Any]:
    """Both parity checks on the same batches: replay against the same model eagerly on the same padded bucket
    (must be bit-identical), and against the unpadded eager engine (probabilities within a relative tolerance)."""
    rows: list[dict[str, Any]] = []
    for name, batch in parity_batches(graph.table, vocab):
        got = graph.run(batch)
        padded = graph.run_padded_eager(batch)
        want = eager.run(batch)
        p_got, p_want = softmax(got.logits), softmax(want.logits)
        bound = PROB_ATOL[dtype] + PROB_RTOL[dtype] * np.abs(p_want)
        rows.append({"shape": name, "texts": batch.size, "longest": batch.max_length, "mode": got.timing.mode,
                     "bucket": str(got.timing.bucket),
                     "exact": bool(np.array_equal(got.logits, padded)),
                     "max_abs_diff_padded_eager": float(np.max(np.abs(got.logits - padded))),
                     "max_abs_diff_logits": float(np.max(np.abs(got.logits - want.logits))),
                     "max_prob_excess": float(np.max(np.abs(p_got - p_want) - bound)),
                     "finite": bool(np.isfinite(got.logits).all())})
    replayed = all(row["mode"] == "graph" for row in rows)
    exact = replayed and all(row["exact"] for row in rows)
    # NaN compares False, so a NaN logit fails here rather than passing unnoticed.
    close = replayed and all(row["finite"] and row["max_prob_excess"] <= 0 for row in rows)
    book.record("graph_parity_exact", exact, **where, shapes=[
        {k: row[k] for k in ("shape", "mode", "exact", "max_abs_diff_padded_eager")} for row in rows])
    book.record("graph_parity_cross_path", close, **where, rtol=PROB_RTOL[dtype], atol=PROB_ATOL[dtype], shapes=[
        {k: row[k] for k in ("shape", "mode", "max_abs_diff_logits", "max_prob_excess")} for row in rows])
    return {"exact": exact, "cross_path": close, "all_replayed": replayed, "pass": exact and close, "shapes": rows}


def check_stream(capturer: Capturer | None, book: CheckBook, where: dict[str, Any]) -> None:
    if not isinstance(capturer, CudaGraphCapturer):
        book.skip("single_capture_stream", "the stand-in capturer has no streams; its bookkeeping is unit-tested "
                                           "(tests/service/engines/test_graph_capture.py)")
        return
    handles = sorted({handle for _, handle in capturer.stream_uses})
    default = torch.cuda.default_stream(capturer.stream.device).cuda_stream
    ok = capturer.streams_created == 1 and handles == [capturer.stream.cuda_stream] and default not in handles
    book.record("single_capture_stream", ok, **where, streams_created=capturer.streams_created,
                stream_handles=handles, default_stream=default, uses=len(capturer.stream_uses))


def bucket_throughput(graph: CudaGraphEngine, vocab: int) -> list[dict[str, Any]]:
    """Every bucket, filled to the brim: replay time and rows/tokens per second (engine timing, host copy-out
    included)."""
    rng = np.random.default_rng(3)
    rows = []
    for bucket in sorted(graph.table.all(), key=lambda b: (b.batch, b.length)):
        batch = random_batch([bucket.length] * bucket.batch, vocab, rng)
        for _ in range(THROUGHPUT_WARM):
            graph.run(batch)
        times = [graph.run(batch).timing.duration_s for _ in range(THROUGHPUT_RUNS)]
        p50 = float(np.percentile(times, 50))
        rows.append({"bucket": str(bucket), "batch": bucket.batch, "length": bucket.length,
                     "p50_ms": p50 * 1e3, "p99_ms": float(np.percentile(times, 99)) * 1e3,
                     "rows_per_s": bucket.batch / p50 if p50 > 0 else None,
                     "tokens_per_s": bucket.tokens / p50 if p50 > 0 else None})
    return rows


def time_runs(engine: CudaGraphEngine | EagerEngine, batch: TokenBatch, plan: Plan) -> list[float]:
    for _ in range(plan.warm_runs):
        engine.run(batch)
    # The engine's own timing: from the call to logits on the host, the one sync included.
    return [engine.run(batch).timing.duration_s for _ in range(plan.iterations)]


def measure_latency(graph: CudaGraphEngine, eager: EagerEngine, vocab: int, plan: Plan) -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    rows = []
    for batch_size, length in LATENCY_SHAPES:
        batch = random_batch([length] * batch_size, vocab, rng)
        graph_times = time_runs(graph, batch, plan)
        eager_times = time_runs(eager, batch, plan)
        g, e = percentiles(graph_times), percentiles(eager_times)
        rows.append({"batch": batch_size, "length": length, "graph": g, "eager": e,
                     "speedup_p50": e["p50_ms"] / g["p50_ms"] if g["p50_ms"] > 0 else None})
    return rows


def check_fallback(graph: CudaGraphEngine, vocab: int) -> dict[str, Any]:
    """One batch wider than the largest batch bucket must run eagerly and be counted, not fail."""
    before = graph.stats().eager_fallbacks_total
    batch = random_batch([16] * (graph.table.max_batch + 1), vocab, np.random.default_rng(2))
    result = graph.run(batch)
    counted = graph.stats().eager_fallbacks_total - before
    return {"texts": batch.size, "mode": result.timing.mode, "counted": counted,
            "pass": result.timing.mode == "eager" and counted == 1}


def measure(model: BertClassifier, dtype: Dtype, plan: Plan, capturer: Capturer | None, book: CheckBook,
            model_name: str, throughput: bool = False) -> dict[str, Any]:
    vocab = model.config.vocab_size
    where = {"model": model_name, "dtype": dtype}
    if capturer is None:
        capturer = CudaGraphCapturer(torch.device(plan.device))
    graph = CudaGraphEngine(model, plan.device, dtype, plan.table, capturer=capturer)
    # The eager reference gets its own copy: EagerEngine moves an fp32 model to the device in place.
    eager = EagerEngine(copy.deepcopy(model), plan.device, dtype)
    try:
        report = graph.warmup()
        eager.warmup()
        capture = graph.stats().capture
        assert capture is not None
        result: dict[str, Any] = {
            "dtype": dtype,
            "kind": graph.kind,
            "buckets": len(capture.buckets),
            "warmup_s": report.seconds,
            "capture_s": capture.seconds,
            "graph_pool_reserved_bytes": capture.pool_reserved_bytes,
            "graph_pool_allocated_bytes": capture.pool_allocated_bytes,
            "reserved_before_warmup_bytes": capture.reserved_before_warmup_bytes,
            "reserved_after_warmup_bytes": capture.reserved_after_warmup_bytes,
            "reserved_after_capture_bytes": capture.reserved_after_capture_bytes,
            "sdpa_backend": capture.sdpa_backend,
        }
        check_stream(capturer, book, where)
        result["parity"] = check_parity(graph, eager, dtype, vocab, book, where)
        result["latency"] = measure_latency(graph, eager, vocab, plan)
        result["fallback"] = check_fallback(graph, vocab)
        book.record("overflow_runs_eager", result["fallback"]["pass"], **where, **result["fallback"])
        if throughput:
            result["throughput"] = bucket_throughput(graph, vocab)
        stats = graph.stats()
        result["replays_total"] = stats.replays_total
        result["eager_fallbacks"] = dict(stats.eager_fallbacks)
        result["pass"] = result["parity"]["pass"] and result["fallback"]["pass"]
        return result
    finally:
        del graph, eager, capturer
        gc.collect()  # graphs hold their pool until collected; free it before the next model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def record_bert_base(book: CheckBook, run: dict[str, Any], model_name: str) -> None:
    """bert_base_latency from the BERT-base-sized fp16 run: batch-1 graph vs eager, P99/P50, bucket throughput."""
    if "error" in run:
        book.record("bert_base_latency", False, model=model_name, error=run["error"])
        return
    (one,) = [row for row in run["latency"] if row["batch"] == 1]
    g, e = one["graph"], one["eager"]
    batch_1 = {"length": one["length"], "graph_p50_ms": g["p50_ms"], "graph_p99_ms": g["p99_ms"],
               "eager_p50_ms": e["p50_ms"], "eager_p99_ms": e["p99_ms"],
               "graph_p99_over_p50": g["p99_ms"] / g["p50_ms"] if g["p50_ms"] > 0 else None,
               "eager_p99_over_p50": e["p99_ms"] / e["p50_ms"] if e["p50_ms"] > 0 else None,
               "speedup_p50": one["speedup_p50"]}
    throughput = run.get("throughput", [])
    ok = bool(throughput) and all(row["rows_per_s"] for row in throughput) and run["parity"]["all_replayed"]
    book.record("bert_base_latency", ok, model=model_name, dtype=run["dtype"], weights="random (speed only)",
                batch_1=batch_1, throughput=throughput)
