"""Device choice and engine construction, kept apart from loading and from config parsing."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from service.buckets import BucketTable, batch_buckets, length_buckets
from service.engines.base import Engine
from service.engines.eager import EagerEngine
from service.engines.fallback import FallbackEngine
from service.engines.ladder import Rung, StartupLadder
from service.engines.pressure import cuda_memory_reader
from service.errors import DeviceUnavailableError
from service.model.loader import LoadedModel
from service.observer import Observer
from service.settings import Settings


@dataclass(frozen=True, slots=True)
class DeviceChoice:
    device: str  # "cpu" or "cuda:0"
    reason: str  # one human sentence, logged at start-up


def choose_device(requested: str) -> DeviceChoice:
    available = torch.cuda.is_available()
    if requested == "cpu":
        return DeviceChoice("cpu", "--device cpu was asked for")
    if requested == "cuda":
        if not available:
            raise DeviceUnavailableError("--device cuda was asked for but torch sees no usable CUDA device")
        return DeviceChoice("cuda:0", "--device cuda was asked for")
    if available:
        return DeviceChoice("cuda:0", f"auto: CUDA device found ({torch.cuda.get_device_name(0)})")
    why = "torch was built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
    return DeviceChoice("cpu", f"auto: {why}")


def bucket_table(settings: Settings, max_length: int) -> BucketTable:
    """The (batch, length) buckets CUDA graphs are captured for."""
    return BucketTable(
        batch_buckets(settings.batch_buckets, settings.max_batch_size),
        length_buckets(settings.length_buckets, max_length),
    )


def build_engine(loaded: LoadedModel, settings: Settings, device: str, max_length: int) -> Engine:
    """The primary engine for `device`: eager fp32/int8 on the CPU; on a GPU a start-up ladder (CUDA graphs on every
    bucket, on fewer, then eager CUDA) that settles on the first rung that warms up (service.engines.ladder)."""
    if device == "cpu":
        return EagerEngine(loaded.model, "cpu", "fp32", settings.quantize, settings.cpu_executor)
    return StartupLadder(device, cuda_rungs(loaded, settings, device, max_length))


# Each graph rung below the first halves the largest batch bucket again: the shared pool is sized by the largest graph.
FEWER_BUCKET_DIVISORS = (2, 4)


def cuda_rungs(loaded: LoadedModel, settings: Settings, device: str, max_length: int) -> list[Rung]:
    """The start-up ladder for a GPU, best first. Nothing is built (nor copied to the device) until a rung is tried."""
    rungs: list[Rung] = []
    if settings.cuda_graphs:
        from service.engines.graphs import CudaGraphEngine

        def graphs(table: BucketTable) -> Engine:
            return CudaGraphEngine(loaded.model, device, settings.cuda_dtype, table,
                                   debug_buffers=settings.debug_graph_buffers)

        full = bucket_table(settings, max_length)
        tables = [full] + [t for t in (capped(full, full.max_batch // d) for d in FEWER_BUCKET_DIVISORS) if t]
        for index, table in enumerate(tables):
            mode = "as_configured" if index == 0 else "fewer_buckets"
            detail = f"CUDA graphs on {len(table.all())} buckets (batch up to {table.max_batch})"
            rungs.append(Rung(mode, detail, functools.partial(graphs, table)))
    rungs.append(Rung("as_configured" if not rungs else "eager_cuda", f"eager CUDA ({settings.cuda_dtype})",
                      lambda: EagerEngine(loaded.model, device, settings.cuda_dtype)))
    return rungs


def capped(table: BucketTable, max_batch: int) -> BucketTable | None:
    """`table` without the batch buckets above `max_batch`; None when none would be left."""
    batches = tuple(b for b in table.batches if b <= max_batch)
    return BucketTable(batches, table.lengths) if batches else None


def with_cpu_fallback(primary: Engine, loaded: LoadedModel, settings: Settings, observer: Observer, *,
                      on_cpu: bool = False) -> Engine:
    """`primary` behind a FallbackEngine whose secondary is a CPU engine over the same loaded model, when the primary
    is on a GPU and settings.cpu_fallback is on; else `primary` itself. The GPU engines copy the model to the
    device, so `loaded.model` is still on the CPU here and the CPU engine shares its weights.

    `on_cpu` puts a CPU primary behind the fallback too (a second CPU engine as the secondary): with chaos on, a
    simulated GPU fault on a CPU-only machine then takes the real fallback path. Such a primary has no GPU memory
    to watch, so no memory-pressure switch."""
    on_gpu = primary.device != "cpu"
    if not settings.cpu_fallback or not (on_gpu or on_cpu):
        return primary
    secondary = EagerEngine(loaded.model, "cpu", "fp32", settings.quantize, settings.cpu_executor)
    return FallbackEngine(primary, secondary, settings=settings, observer=observer,
                          memory_reader=cuda_memory_reader(primary.device) if on_gpu else None)
