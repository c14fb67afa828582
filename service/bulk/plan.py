"""How a window of tokenized texts is cut into engine batches: length-sorted, each batch under a padded-token budget.

Offline, the engine can see a whole window before it runs anything, so it sorts it by length: a batch then holds texts
of nearly one length and pads little (sorted batches ran 1.2-2x faster than file order:
docs/benchmarks/2026-11-30-cpu-fp32-int8.md, docs/benchmarks/2026-11-30-engine-vs-transformers.md). The budget bounds
each batch's padded area (rows x its longest text), so short texts go many to a batch and long ones few, at a roughly
constant cost per batch.
"""

from __future__ import annotations

import numpy as np

from glassbox.service.types import IntArray


def cut_batches(lengths: IntArray, max_batch: int, batch_tokens: int) -> list[IntArray]:
    """[n] token counts -> the row indices of each batch, shortest texts first. A batch holds at most `max_batch`
    rows and, padded to its longest text, at most `batch_tokens` tokens; a text longer than the budget alone goes
    in a batch of one."""
    if max_batch < 1 or batch_tokens < 1:
        raise ValueError("max_batch and batch_tokens must be at least 1")
    order = np.argsort(lengths, kind="stable")  # [n] shortest first; stable keeps input order among equals
    batches: list[IntArray] = []
    start = 0
    sorted_lengths = lengths[order].tolist()
    for end, length in enumerate(sorted_lengths):
        rows = end - start
        # Sorted ascending, so the text being added is the batch's longest: the padded area is (rows + 1) x it.
        if rows and (rows == max_batch or (rows + 1) * length > batch_tokens):
            batches.append(order[start:end])
            start = end
    if start < len(sorted_lengths):
        batches.append(order[start:])
    return batches
