"""The engine protocol: the only thing the batcher knows about how logits are computed."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import torch

from glassbox.service.types import EngineHealth, EngineResult, TokenBatch, WarmupReport


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


def is_concurrent(engine: Engine) -> bool:
    """Whether the engine says several threads may call `run` at once (an optional capability; default no)."""
    return bool(getattr(engine, "concurrent", False))


def engine_threads(setting: int, engine: Engine, cores: int) -> int:
    """How many engine threads run batches side by side: `setting` when positive (capped at 1 for an engine that
    is not concurrent), else 2 for a concurrent engine on a host with at least 2 cores, else 1.

    Why 2 on the CPU: measured on the 2-core development machine (docs/benchmarks/2026-12-01-serving-v2.md), two
    batches at a time with one intra-op thread each ran 10-20% faster than one batch at a time on two, and a batch
    never stalls at an intra-op barrier because the HTTP event loop took one of its threads' cores."""
    if not is_concurrent(engine):
        return 1
    if setting > 0:
        return setting
    return 2 if cores >= 2 else 1
