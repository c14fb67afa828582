"""What the CUDA graph engine did: graphs captured, replays per bucket, eager fallbacks by reason.

Counts are kept by the engine's single worker thread and handed out as frozen snapshots, so a reader
(telemetry, a health probe, the GPU check) never sees a half-updated set of numbers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from glassbox.service.buckets import BucketTable
from glassbox.service.types import Bucket

FallbackReason = Literal["batch_above_buckets", "length_above_buckets", "batch_and_length_above_buckets",
                         "not_captured"]


def fallback_reason(n: int, length: int, table: BucketTable) -> FallbackReason:
    """Why a batch of n texts up to `length` tokens has no captured graph (a small, bounded set of labels)."""
    too_many, too_long = n > table.max_batch, length > table.max_length
    if too_many and too_long:
        return "batch_and_length_above_buckets"
    if too_many:
        return "batch_above_buckets"
    if too_long:
        return "length_above_buckets"
    return "not_captured"


@dataclass(frozen=True, slots=True)
class CaptureReport:
    """Measured once, at warm-up. Pool bytes are the allocator's reserved/allocated growth across capture."""

    buckets: tuple[Bucket, ...]  # in capture order, largest first
    seconds: float
    pool_reserved_bytes: int
    pool_allocated_bytes: int
    # torch.cuda.memory_reserved at each step of warmup() (0 on the CPU): before the eager warm-up, after it (cached
    # blocks returned), after capture. Logged, so a start-up that runs out of memory says where it grew.
    reserved_before_warmup_bytes: int = 0
    reserved_after_warmup_bytes: int = 0
    reserved_after_capture_bytes: int = 0
    # the attention kernel the dispatcher picks for the padded buckets (glassbox.service.engines.sdpa)
    sdpa_backend: str = ""


@dataclass(frozen=True, slots=True)
class GraphStats:
    capture: CaptureReport | None  # None until warm-up has captured
    replays: Mapping[Bucket, int] = field(default_factory=lambda: MappingProxyType({}))
    eager_fallbacks: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def replays_total(self) -> int:
        return sum(self.replays.values())

    @property
    def eager_fallbacks_total(self) -> int:
        return sum(self.eager_fallbacks.values())


class GraphCounters:
    """Mutable tallies owned by the engine thread; `snapshot` copies them into a read-only GraphStats."""

    def __init__(self) -> None:
        self._replays: Counter[Bucket] = Counter()
        self._fallbacks: Counter[str] = Counter()

    def replayed(self, bucket: Bucket) -> None:
        self._replays[bucket] += 1

    def fell_back(self, reason: FallbackReason) -> None:
        self._fallbacks[reason] += 1

    def snapshot(self, capture: CaptureReport | None) -> GraphStats:
        return GraphStats(
            capture=capture,
            replays=MappingProxyType(dict(self._replays)),
            eager_fallbacks=MappingProxyType(dict(self._fallbacks)),
        )
