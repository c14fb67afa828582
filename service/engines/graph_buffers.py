"""Static input buffers for CUDA graphs: allocated once, refilled in place for every run.

A captured graph remembers device addresses, not tensors, so its inputs must live at the same address for
the life of the engine. We allocate ONE flat buffer per input, sized for the largest bucket, and give each
bucket the contiguous prefix `flat[:b * s].view(b, s)` of it rather than a buffer of its own:

- every graph reads the same two addresses, so the debug check has two inputs to watch, not 2 x buckets;
- the prefix view of a bucket is contiguous (a `[:b, :s]` slice of a 2-D buffer would not be), so the
  captured kernels see the same layout an eager run would;
- memory is one largest-bucket's worth instead of the sum over buckets. Sharing is safe because one
  engine thread fills, replays and copies out one batch at a time.

The host side has matching staging buffers (pinned on CUDA so the copy to the device is asynchronous);
the padding itself is plain numpy in `pad_into`, which is what the CPU tests exercise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from glassbox.service.errors import EngineError
from glassbox.service.types import Bucket, TokenBatch


def pad_into(ids: npt.NDArray[np.int64], mask: npt.NDArray[np.bool_], batch: TokenBatch, pad_id: int,
             types: npt.NDArray[np.int64] | None = None) -> None:
    """Write `batch` into the top-left corner of `ids`/`mask` (and `types`; all [b, s]) and pad everything else.

    Padding rows (beyond the batch's n texts) keep position 0 visible: a row whose mask is all False would
    make attention divide zero by zero and fill the row with NaN. Their logits are computed and discarded.
    Token types are 0 wherever the batch has none (single texts, padding).
    """
    rows, width = ids.shape
    n, longest = batch.size, batch.max_length
    if n > rows or longest > width:
        raise ValueError(f"a batch of {n} texts up to {longest} tokens does not fit a {rows}x{width} buffer")
    ids[:n, :longest] = batch.ids[:, :longest]
    ids[:n, longest:] = pad_id
    ids[n:] = pad_id
    mask[:n] = np.arange(width)[None, :] < batch.lengths[:, None]  # [n, width]
    mask[n:] = False
    mask[n:, 0] = True
    if types is not None:
        types[...] = 0
        if batch.type_ids is not None:
            types[:n, :longest] = batch.type_ids[:, :longest]


def empty_batch() -> TokenBatch:
    """Zero texts: `pad_into` then writes nothing but padding rows (what warm-up and capture run on)."""
    return TokenBatch(
        ids=np.zeros((0, 0), dtype=np.int64),
        lengths=np.zeros(0, dtype=np.int64),
        truncated=np.zeros(0, dtype=np.bool_),
    )


@dataclass(frozen=True, slots=True)
class BufferAddresses:
    """Where the static tensors live. A graph replays against these addresses, so they must never change."""

    ids: int
    mask: int
    host_ids: int
    host_mask: int
    types: int = 0  # 0 when the model reads no token types
    host_types: int = 0


class StaticBuffers:
    """Device input buffers shared by every bucket (see the module docstring), plus host staging."""

    def __init__(self, max_batch: int, max_length: int, device: torch.device, pad_id: int,
                 token_types: bool = False) -> None:
        if max_batch < 1 or max_length < 1:
            raise ValueError("static buffers need max_batch >= 1 and max_length >= 1")
        size = max_batch * max_length
        self.max_batch = max_batch
        self.max_length = max_length
        self.pad_id = pad_id
        self._device = device
        pin = device.type == "cuda"  # pinned host memory makes the upload asynchronous; it needs CUDA
        self.ids = torch.full((size,), pad_id, dtype=torch.int64, device=device)  # [max_batch * max_length]
        self.mask = torch.zeros(size, dtype=torch.bool, device=device)  # [max_batch * max_length]
        self._host_ids = torch.full((size,), pad_id, dtype=torch.int64, pin_memory=pin)
        self._host_mask = torch.zeros(size, dtype=torch.bool, pin_memory=pin)
        # Token type ids, for models whose embeddings read them (text pairs); None otherwise.
        self.types = torch.zeros(size, dtype=torch.int64, device=device) if token_types else None
        self._host_types = torch.zeros(size, dtype=torch.int64, pin_memory=pin) if token_types else None
        # Marks the end of the last upload: the host staging may be rewritten only once the device has read
        # it. run() synchronises anyway when it copies logits out, but warm-up fills back to back.
        self._uploaded = torch.cuda.Event() if pin else None  # type: ignore[no-untyped-call]

    def views(self, bucket: Bucket) -> tuple[Tensor, Tensor]:
        """The bucket's contiguous device views: ids [b, s] int64 and mask [b, s] bool."""
        self._check_fits(bucket)
        size = bucket.tokens
        return self.ids[:size].view(bucket.batch, bucket.length), self.mask[:size].view(bucket.batch, bucket.length)

    def type_view(self, bucket: Bucket) -> Tensor | None:
        """The bucket's contiguous device view of the token type ids [b, s] int64, None without token types."""
        self._check_fits(bucket)
        return None if self.types is None else self.types[: bucket.tokens].view(bucket.batch, bucket.length)

    def fill(self, batch: TokenBatch, bucket: Bucket) -> None:
        """Pad `batch` to `bucket` on the host, then copy it into the bucket's device views in place.

        The copies are queued on the current stream; whoever reads the result to the host synchronises.
        """
        self._check_fits(bucket)
        size = bucket.tokens
        host_ids = self._host_ids[:size].view(bucket.batch, bucket.length)  # [b, s]
        host_mask = self._host_mask[:size].view(bucket.batch, bucket.length)  # [b, s]
        if self._uploaded is not None:
            self._uploaded.synchronize()
        host_types = None if self._host_types is None else self._host_types[:size].view(bucket.batch, bucket.length)
        pad_into(host_ids.numpy(), host_mask.numpy(), batch, self.pad_id,
                 None if host_types is None else host_types.numpy())
        device_ids, device_mask = self.views(bucket)
        device_ids.copy_(host_ids, non_blocking=True)
        device_mask.copy_(host_mask, non_blocking=True)
        device_types = self.type_view(bucket)
        if device_types is not None and host_types is not None:
            device_types.copy_(host_types, non_blocking=True)
        if self._uploaded is not None:
            self._uploaded.record(torch.cuda.current_stream(self._device))

    def addresses(self) -> BufferAddresses:
        return BufferAddresses(
            ids=self.ids.data_ptr(),
            mask=self.mask.data_ptr(),
            host_ids=self._host_ids.data_ptr(),
            host_mask=self._host_mask.data_ptr(),
            types=0 if self.types is None else self.types.data_ptr(),
            host_types=0 if self._host_types is None else self._host_types.data_ptr(),
        )

    def _check_fits(self, bucket: Bucket) -> None:
        if bucket.batch > self.max_batch or bucket.length > self.max_length:
            raise ValueError(f"bucket {bucket} is larger than the static buffers ({self.max_batch}x{self.max_length})")


def check_addresses(expected: BufferAddresses, actual: BufferAddresses, outputs: dict[str, tuple[int, int]]) -> None:
    """Raise EngineError naming every static tensor that moved. `outputs` maps a name to (expected, actual)."""
    moved = [
        name for name in ("ids", "mask", "host_ids", "host_mask", "types", "host_types")
        if getattr(expected, name) != getattr(actual, name)
    ]
    moved += [name for name, (before, now) in outputs.items() if before != now]
    if moved:
        raise EngineError(
            f"CUDA graph static buffers moved ({', '.join(moved)}): a replay would read or write freed memory"
        )
