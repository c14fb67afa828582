"""The GPU check's named checks: what each proves, and its status in this run.

Every check has a status: `passed`, `failed`, `needs-gpu` (a CPU rehearsal ran what it could of it, and that
passed, but what it proves needs a device) or `skipped` (it could not run here, with the reason). A check run several
times (per model and dtype) fails if any run failed. docs/gpu-check.md describes each one; a test keeps the two in
step. Imports only the standard library.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

# name -> (what it proves, whether proving it needs a GPU)
CATALOGUE: dict[str, tuple[str, bool]] = {
    "single_capture_stream": (
        "every warm-up and every capture ran on one side stream, the one handed to torch.cuda.graph, not the "
        "default stream", True),
    "graph_parity_exact": (
        "a graph replay returns bit-identical logits to the same private model run eagerly on the same padded "
        "bucket (same kernels, same inputs)", True),
    "graph_parity_cross_path": (
        "graph replay agrees with the unpadded eager engine: softmax probabilities within a relative tolerance "
        "(fp32 1e-4, half precision 2e-2), no NaN, every batch replayed", True),
    "capture_replay_threads": (
        "graphs captured on one thread (as the server's warm-up thread does) replay correctly from another (the "
        "engine thread)", True),
    "fallback_wraps_graphs": (
        "FallbackEngine around the graph engine, with the real CUDA memory reader: batches replay on the GPU, the "
        "reader returns sane device readings, nothing degrades", True),
    "pressure_spares_replay": (
        "at memory pressure, batches the graph engine replays stay on the GPU and only batches it would run eagerly "
        "go to the CPU", False),
    "replay_allocation_free": (
        "a graph replay, copy-out included, makes no allocation in the caching allocator", True),
    "capture_oom_degrades": (
        "an out-of-memory during capture drops the graphs and the start-up ladder captures fewer buckets, which "
        "then replay exactly; when nothing fits, the server starts on the CPU with the breaker open", True),
    "nvml_lookup": (
        "NVML finds torch's CUDA device by UUID (a whole GPU or a MIG instance), and its memory total matches "
        "torch's", True),
    "oom_classify": (
        "every allocation failure (the allocator's OutOfMemoryError, a cuBLAS workspace failure as a plain "
        "RuntimeError) is classified as an OOM by the engine's own classifier", True),
    "overflow_runs_eager": (
        "a batch above the largest bucket runs eagerly and is counted, not failed", False),
    "bert_base_latency": (
        "BERT-base-sized model (random weights: speed only): graph vs eager batch-1 latency P50/P99 and "
        "throughput per (batch, length) bucket in fp16", True),
    "e2e_server": (
        "the server on the device under glassbox bench open-loop load at rising rates: the highest rate whose "
        "P99 stays within 10 ms", True),
    "engine_trace": (
        "POST /debug/trace on the serving engine under load: the torch profiler's trace, recorded on threads it was "
        "not started on, holds the model's CUDA kernels (on the CPU: its operators on the engine thread)", True),
    "gpu_tests": (
        "the gpu-marked pytest tests (graph capture and replay, one capture stream, exact parity, the chaos "
        "allocator faults) pass on the device with nothing skipped", True),
    "oom_fallback": (
        "--oom only: a real CUDA OOM in a batch is served by the CPU, a probe under fill fails, the GPU comes back "
        "after; the pressure switch on real readings", True),
}
REQUIRED = ("single_capture_stream", "graph_parity_exact", "graph_parity_cross_path", "capture_replay_threads",
            "fallback_wraps_graphs", "pressure_spares_replay", "capture_oom_degrades", "nvml_lookup", "oom_classify",
            "bert_base_latency")


@dataclass
class Check:
    name: str
    proves: str
    needs_gpu: bool
    status: str = "not-run"
    runs: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"status": self.status, "proves": self.proves, "needs_gpu": self.needs_gpu}
        if self.reason:
            data["reason"] = self.reason
        if self.runs:
            data["runs"] = self.runs
        return data


class CheckBook:
    def __init__(self, rehearsal: bool) -> None:
        self.rehearsal = rehearsal
        self.checks = {name: Check(name, proves, needs_gpu) for name, (proves, needs_gpu) in CATALOGUE.items()}

    def record(self, name: str, ok: bool, **detail: Any) -> bool:
        """One run of a check. On a CPU rehearsal a passing run of a check that needs a GPU is `needs-gpu`."""
        check = self.checks[name]
        check.runs.append({"pass": bool(ok), **detail})
        if not ok:
            check.status = "failed"
        elif check.status != "failed":
            check.status = "needs-gpu" if self.rehearsal and check.needs_gpu else "passed"
        return bool(ok)

    def error(self, name: str, exc: BaseException, **detail: Any) -> bool:
        """A run that raised: failed, with the error and the tail of its traceback in the JSON."""
        return self.record(name, False, error=f"{type(exc).__name__}: {exc}"[:500],
                           traceback=traceback.format_exc()[-2000:], **detail)

    def skip(self, name: str, reason: str) -> None:
        """Could not run here at all: on a rehearsal a device check is `needs-gpu`, anything else `skipped`."""
        check = self.checks[name]
        if check.status == "not-run":
            check.status = "needs-gpu" if self.rehearsal and check.needs_gpu else "skipped"
            check.reason = reason

    @property
    def passed(self) -> bool:
        return all(check.status != "failed" for check in self.checks.values())

    def to_json(self) -> dict[str, dict[str, Any]]:
        return {name: check.to_json() for name, check in self.checks.items()}

    def lines(self) -> list[str]:
        width = max(len(name) for name in self.checks)
        return [f"  {name:<{width}}  {check.status}" + (f" ({check.reason})" if check.reason else "")
                for name, check in self.checks.items()]
