"""Plain data passed between stages. Frozen, typed, no behaviour beyond small derived properties."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float32]

EngineMode = Literal["graph", "eager"]
# How a classifier's logits become answers (transformers' `problem_type`): softmax over labels, one sigmoid per
# label, or the raw number.
ProblemType = Literal["single_label_classification", "multi_label_classification", "regression"]
PROBLEM_TYPES: tuple[ProblemType, ...] = ("single_label_classification", "multi_label_classification", "regression")


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """Token ids of n texts (or text pairs), right-padded with the pad id to the longest of them.

    ids: [n, max(lengths)] int64; lengths: [n] int64 (1 <= length); truncated: [n] bool;
    type_ids: [n, max(lengths)] int64 token type (segment) ids, padded like ids, or None when the model has no
    token types or no row is a pair (every type id would be 0).
    """

    ids: IntArray
    lengths: IntArray
    truncated: BoolArray
    type_ids: IntArray | None = None

    @property
    def size(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def max_length(self) -> int:
        return int(self.lengths.max()) if self.size else 0

    @property
    def real_tokens(self) -> int:
        return int(self.lengths.sum())

    def select(self, rows: IntArray | list[int]) -> TokenBatch:
        """The given rows, re-padded to their own longest length."""
        index = np.asarray(rows, dtype=np.int64)
        lengths = self.lengths[index]
        width = int(lengths.max()) if len(index) else 0
        types = None if self.type_ids is None else self.type_ids[index, :width]
        return TokenBatch(ids=self.ids[index, :width], lengths=lengths, truncated=self.truncated[index], type_ids=types)


@dataclass(frozen=True, slots=True)
class Bucket:
    """A fixed (batch, length) shape the engine pads to."""

    batch: int
    length: int

    @property
    def tokens(self) -> int:
        return self.batch * self.length

    def __str__(self) -> str:
        return f"{self.batch}x{self.length}"


@dataclass(frozen=True, slots=True)
class EngineTiming:
    """What one engine run did. Times are `perf_counter_ns` readings."""

    start_ns: int
    end_ns: int
    device: str  # "cpu", "cuda:0", ...
    mode: EngineMode
    rows: int  # real texts in the batch
    real_tokens: int  # sum of real lengths
    padded_tokens: int  # tokens actually computed (rows x width, or the bucket's area)
    bucket: Bucket | None  # the graph bucket replayed, None when run eagerly

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def padding_ratio(self) -> float:
        return 1.0 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0


@dataclass(frozen=True, slots=True)
class EngineResult:
    logits: FloatArray  # [n, num_labels] float32, on the host
    timing: EngineTiming


# How the engine started. Anything but the first means the GPU ran out of memory (or failed) while warming up or
# capturing, and the server started on less: CUDA graphs on fewer buckets, eager CUDA, or the CPU fallback.
START_MODES = ("as_configured", "fewer_buckets", "eager_cuda", "cpu_fallback")


@dataclass(frozen=True, slots=True)
class WarmupReport:
    device: str
    kind: str
    buckets: tuple[Bucket, ...]  # shapes that were warmed (and captured, for graph engines)
    seconds: float
    graph_pool_bytes: int = 0
    start_mode: str = "as_configured"  # or how a GPU start-up degraded: START_MODES
    executor: str = ""  # how an eager engine runs its forward pass: torchscript, python, aoti ("" for the others)


@dataclass(frozen=True, slots=True)
class EngineHealth:
    ok: bool
    device: str
    kind: str
    detail: str = ""


_KIND_DTYPE = re.compile(r"\b(eager|graph[\w-]*)-(fp32|bf16|fp16|int8)\b")


def engine_dtype(kind: str, device: str) -> str:
    """The number format the engine of `kind` computes in on `device` ("fp32", "bf16", "fp16", "int8"; "" when the kind
    says none, as the null engine's): on a CPU the CPU engine's (a fallback's secondary), elsewhere the GPU engine's.
    "fallback(graph-fp16, eager-bf16)" is fp16 on cuda:0 and bf16 on cpu."""
    found = _KIND_DTYPE.findall(kind)
    if device.startswith("cpu"):
        found = [match for match in found if match[0] == "eager"] or found
        return found[-1][1] if found else ""
    return found[0][1] if found else ""
