"""One (model, dtype) of the GPU check: capture, graph-vs-eager parity, graph-vs-eager latency, fallback count.

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

from service.buckets import BucketTable
from service.engines.eager import EagerEngine
from service.engines.graph_capture import Capturer
from service.engines.graphs import CudaGraphEngine
from service.model.bert import BertClassifier
from service.types import TokenBatch

Dtype = Literal["fp32", "fp16"]
TOLERANCE: dict[str, float] = {"fp32": 1e-4, "fp16": 1e-2}
LATENCY_SHAPES = ((1, 128), (32, 128))  # (batch, length), as issue 2 asks


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


def check_parity(graph: CudaGraphEngine, eager: EagerEngine, dtype: str, vocab: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    diffs: list[float] = []
    for name, batch in parity_batches(graph.table, vocab):
        got, want = graph.run(batch), eager.run(batch)
        diff = float(np.abs(got.logits - want.logits).max())
        diffs.append(diff)
        rows.append({"shape": name, "texts": batch.size, "longest": batch.max_length, "mode": got.timing.mode,
                     "bucket": str(got.timing.bucket), "max_abs_diff": diff})
    worst = float(np.max(diffs))  # np.max keeps a NaN (the builtin max may drop it, depending on order)
    all_graph = all(row["mode"] == "graph" for row in rows)
    # NaN compares False, so a NaN logit fails here rather than passing unnoticed.
    ok = all_graph and bool(worst <= TOLERANCE[dtype])
    return {"max_abs_diff": worst, "tolerance": TOLERANCE[dtype], "all_replayed": all_graph, "pass": ok,
            "shapes": rows}


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


def measure(model: BertClassifier, dtype: Dtype, plan: Plan, capturer: Capturer | None) -> dict[str, Any]:
    vocab = model.config.vocab_size
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
        }
        result["parity"] = check_parity(graph, eager, dtype, vocab)
        result["latency"] = measure_latency(graph, eager, vocab, plan)
        result["fallback"] = check_fallback(graph, vocab)
        stats = graph.stats()
        result["replays_total"] = stats.replays_total
        result["eager_fallbacks"] = dict(stats.eager_fallbacks)
        result["pass"] = result["parity"]["pass"] and result["fallback"]["pass"]
        return result
    finally:
        del graph, eager
        gc.collect()  # graphs hold their pool until collected; free it before the next model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
