"""The engine protocol: the only thing the batcher knows about how logits are computed."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import torch

from service.types import EngineHealth, EngineResult, TokenBatch, WarmupReport


@runtime_checkable
class Engine(Protocol):
    """Owns a model on one device. Called from a single engine thread; not thread-safe by design."""

    @property
    def device(self) -> str: ...

    @property
    def kind(self) -> str: ...

    def warmup(self) -> WarmupReport: ...

    def run(self, batch: TokenBatch) -> EngineResult: ...

    def health(self) -> EngineHealth: ...


def replays(engine: object, batch: TokenBatch) -> bool:
    """Whether `engine` would run `batch` by replaying a captured CUDA graph, which allocates no device memory.
    Engines without graphs (and wrappers that do not pass the question on) say no."""
    check = getattr(engine, "replays", None)
    return bool(check(batch)) if callable(check) else False


def attention_mask(lengths: np.ndarray, width: int) -> np.ndarray | None:
    """[n] lengths -> [n, width] bool mask, or None when every row is full (no padding to hide)."""
    if int(lengths.min()) == width:
        return None
    mask: np.ndarray = np.arange(width)[None, :] < lengths[:, None]
    return mask


def configure_torch(threads: int, seed: int) -> None:
    """Process-wide torch settings, applied once by the composition root before engines are built."""
    if threads > 0:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    np.random.seed(seed)
