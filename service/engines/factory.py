"""Device choice and engine construction, kept apart from loading and from config parsing."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

from glassbox.service.buckets import BucketTable, batch_buckets, length_buckets
from glassbox.service.engines.base import Engine
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.engines.fallback import FallbackEngine
from glassbox.service.engines.ladder import Rung, StartupLadder
from glassbox.service.engines.precision import CpuPrecision, PrecisionChoice, choose_precision
from glassbox.service.engines.pressure import cuda_memory_reader
from glassbox.service.errors import DeviceUnavailableError
from glassbox.service.model.loader import LoadedModel
from glassbox.service.observer import Observer
from glassbox.service.settings import Settings

log = logging.getLogger("glassbox.engine")


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


def build_engine(loaded: LoadedModel, settings: Settings, device: str, max_length: int,
                 precision: PrecisionChoice | None = None) -> Engine:
    """The primary engine for `device`: eager fp32, bf16 or int8 on the CPU (`precision`, else chosen here); on a GPU a
    start-up ladder (CUDA graphs on every bucket, on fewer, then eager CUDA) that settles on the first rung that warms
    up (glassbox.service.engines.ladder)."""
    if device == "cpu":
        return cpu_engine(loaded, settings, (precision or choose_cpu_precision(loaded, settings, max_length)).precision)
    return StartupLadder(device, cuda_rungs(loaded, settings, device, max_length))


def cpu_engine(loaded: LoadedModel, settings: Settings, precision: CpuPrecision) -> EagerEngine:
    """A CPU engine over `loaded.model` in `precision` (fp32 shares the loaded weights; bf16 and int8 copy them)."""
    if precision == "int8":
        return EagerEngine(loaded.model, "cpu", "fp32", "int8", settings.cpu_executor)
    return EagerEngine(loaded.model, "cpu", precision, "none", settings.cpu_executor)


def choose_cpu_precision(loaded: LoadedModel, settings: Settings, max_length: int) -> PrecisionChoice:
    """--cpu-dtype and --quantize resolved for this CPU and model (glassbox.service.engines.precision), said in one log
    line."""
    if settings.cpu_executor == "aoti" and settings.cpu_dtype == "auto" and settings.quantize == "none":
        choice = PrecisionChoice("fp32", "auto: --cpu-executor aoti compiles fp32 models only")
    else:
        choice = choose_precision(settings.cpu_dtype, settings.quantize, loaded,
                                  lambda p: cpu_engine(loaded, settings, p), max_length)
    log.info("CPU number format %s: %s", choice.precision, choice.reason)
    return choice


# Each graph rung below the first halves the largest batch bucket again: the shared pool is sized by the largest graph.
FEWER_BUCKET_DIVISORS = (2, 4)


def cuda_rungs(loaded: LoadedModel, settings: Settings, device: str, max_length: int) -> list[Rung]:
    """The start-up ladder for a GPU, best first. Nothing is built (nor copied to the device) until a rung is tried."""
    rungs: list[Rung] = []
    if settings.cuda_graphs:
        from glassbox.service.engines.graphs import CudaGraphEngine

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
                      on_cpu: bool = False, precision: PrecisionChoice | None = None,
                      max_length: int | None = None) -> Engine:
    """`primary` behind a FallbackEngine whose secondary is a CPU engine over the same loaded model, when the primary
    is on a GPU and settings.cpu_fallback is on; else `primary` itself. The GPU engines copy the model to the
    device, so `loaded.model` is still on the CPU here and the CPU engine shares its weights.

    `on_cpu` puts a CPU primary behind the fallback too (a second CPU engine as the secondary): with chaos on, a
    simulated GPU fault on a CPU-only machine then takes the real fallback path. Such a primary has no GPU memory
    to watch, so no memory-pressure switch. The secondary computes in `precision` (the CPU's choice: the fallback
    serves as fast as a CPU-only server would), chosen here when not given."""
    on_gpu = primary.device != "cpu"
    if not settings.cpu_fallback or not (on_gpu or on_cpu):
        return primary
    if precision is None:
        precision = choose_cpu_precision(loaded, settings, max_length or loaded.config.max_tokens)
    secondary = cpu_engine(loaded, settings, precision.precision)
    return FallbackEngine(primary, secondary, settings=settings, observer=observer,
                          memory_reader=cuda_memory_reader(primary.device) if on_gpu else None)
