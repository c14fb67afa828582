"""Timing engine passes over a batch list, interleaving variants, and summarising the numbers.

A "variant" is anything that turns a TokenBatch into logits. Variants compared with each other run in
alternating rounds in one process (A B, then B A, ...) so that a neighbour's load on a shared CPU lands
on all of them alike; ratios are taken per round and their median reported.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from glassbox.service.bench.mix import Batches
from glassbox.service.buckets import BucketTable
from glassbox.service.engines import precision
from glassbox.service.types import FloatArray, IntArray, TokenBatch

Runner = Callable[[TokenBatch], FloatArray]  # batch -> logits [n, labels]


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    run: Runner


@dataclass(frozen=True, slots=True)
class Passes:
    """Every timed pass of one variant over the same batches."""

    latencies_ns: tuple[IntArray, ...]  # per pass: [batches] wall time of each run() call
    predictions: IntArray  # [texts] argmax label per text (from the first pass)

    @property
    def pass_seconds(self) -> list[float]:
        return [float(p.sum()) / 1e9 for p in self.latencies_ns]


def warm_up(run: Runner, batches: Batches, count: int = 16) -> None:
    """A spread of the real batches (short to long when sorted), so every code path and allocator size
    class the timed passes use has been touched once."""
    if not batches.batches:
        return
    for index in np.unique(np.linspace(0, len(batches.batches) - 1, num=min(count, len(batches.batches)))):
        run(batches.batches[int(index)])


def timed_pass(run: Runner, batches: Batches) -> tuple[IntArray, IntArray]:
    """([batches] latency ns, [texts] predicted label)."""
    latencies = np.empty(len(batches.batches), dtype=np.int64)
    predictions = np.empty(batches.texts, dtype=np.int64)
    for i, (batch, rows) in enumerate(zip(batches.batches, batches.rows, strict=True)):
        start = time.perf_counter_ns()
        logits = run(batch)  # the runners return host arrays, so the device has finished
        latencies[i] = time.perf_counter_ns() - start
        predictions[rows] = logits.argmax(axis=-1)
    return latencies, predictions


def interleave(variants: Sequence[Variant], batches: Batches, rounds: int) -> dict[str, Passes]:
    """`rounds` timed passes per variant, the variant order reversed every other round."""
    if rounds < 1:
        raise ValueError("at least one round is needed")
    times: dict[str, list[IntArray]] = {v.name: [] for v in variants}
    predictions: dict[str, IntArray] = {}
    for number in range(rounds):
        for variant in variants if number % 2 == 0 else reversed(variants):
            latencies, predicted = timed_pass(variant.run, batches)
            times[variant.name].append(latencies)
            predictions.setdefault(variant.name, predicted)
    return {v.name: Passes(tuple(times[v.name]), predictions[v.name]) for v in variants}


def _ms(values_ns: IntArray, q: float) -> float:
    return round(float(np.percentile(values_ns, q)) / 1e6, 3)


def summarize(passes: Passes, batches: Batches, table: BucketTable, labels: IntArray | None) -> dict[str, Any]:
    """Throughput (median over passes), batch latency P50/P99 overall and per (batch, length) bucket,
    padding, and accuracy against `labels` when the mix has them."""
    throughputs = [batches.texts / s for s in passes.pass_seconds]
    pooled = np.concatenate(passes.latencies_ns)  # every timed run() call of every pass
    keys = [str(table.lookup(b.size, b.max_length)) for b in batches.batches]
    buckets: dict[str, dict[str, Any]] = {}
    for key in dict.fromkeys(sorted(keys, key=lambda k: tuple(int(x) for x in k.split("x")))):
        members = [i for i, k in enumerate(keys) if k == key]
        lat = np.concatenate([p[members] for p in passes.latencies_ns])
        texts = sum(batches.batches[i].size for i in members)
        buckets[key] = {
            "batches": len(members),
            "texts": texts,
            "p50_ms": _ms(lat, 50),
            "p99_ms": _ms(lat, 99),
            "seq_per_s": round(texts * len(passes.latencies_ns) / (float(lat.sum()) / 1e9), 1),
        }
    real = sum(b.real_tokens for b in batches.batches)
    padded = sum(b.size * b.max_length for b in batches.batches)
    accuracy = None if labels is None else round(float((passes.predictions == labels).mean()), 4)
    return {
        "throughput_seq_per_s": round(float(np.median(throughputs)), 1),
        "throughput_per_pass": [round(t, 1) for t in throughputs],
        "latency_ms": {"p50": _ms(pooled, 50), "p99": _ms(pooled, 99), "mean": round(float(pooled.mean()) / 1e6, 3)},
        "buckets": buckets,
        "texts": batches.texts,
        "batches": len(batches.batches),
        "mean_tokens": round(real / max(1, batches.texts), 1),
        "padding_ratio": round(1.0 - real / max(1, padded), 4),
        "accuracy": accuracy,
    }


def paired_speedup(baseline: Passes, candidate: Passes) -> float:
    """Median over rounds of baseline time / candidate time: > 1 means the candidate is faster."""
    ratios = [b / c for b, c in zip(baseline.pass_seconds, candidate.pass_seconds, strict=True)]
    return round(float(np.median(ratios)), 3)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


FLAGS_OF_NOTE = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


def cpu_flags() -> list[str]:
    """The CPU features that decide these figures (int8 gains 1.4x with AVX2 only and 3.5x with VNNI/AMX; bf16 is
    fast only with AVX512-BF16 or AMX)."""
    present = precision.cpu_flags()
    return [flag for flag in FLAGS_OF_NOTE if flag in present]


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu": cpu_name(),
        "flags": cpu_flags(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def emit(results: dict[str, Any], path: Path | None) -> None:
    """A benchmark's results as indented JSON on stdout, and in `path` too when one is given."""
    text = json.dumps(results, indent=2)
    print(text)
    if path is not None:
        path.write_text(text + "\n")
