"""The batcher and its parts: limits, the bucketed queue, the throughput meter, the result records."""

from glassbox.service.batching.batcher import Batcher
from glassbox.service.batching.limits import BatcherLimits
from glassbox.service.batching.records import (
    DROP_REASONS,
    REJECT_REASONS,
    BatcherStats,
    SubmitResult,
)

__all__ = ["DROP_REASONS", "REJECT_REASONS", "Batcher", "BatcherLimits", "BatcherStats", "SubmitResult"]
