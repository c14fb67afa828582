"""The batcher's public face; the parts live in `service.batching`."""

from service.batching import (
    DROP_REASONS,
    REJECT_REASONS,
    Batcher,
    BatcherLimits,
    BatcherStats,
    SubmitResult,
)

__all__ = ["DROP_REASONS", "REJECT_REASONS", "Batcher", "BatcherLimits", "BatcherStats", "SubmitResult"]
