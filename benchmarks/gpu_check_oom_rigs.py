"""The two rigs of the GPU check's OOM part: a real CUDA device filled with `torch.empty` chunks, and the CPU
rehearsal's simulated GPU. A rig holds the engines, how memory is filled and freed, and how it is read.

Imports only what the bare GPU machine has (see benchmarks/gpu_check.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from glassbox.service.engines.base import Engine
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.engines.faults import classify
from glassbox.service.engines.pressure import MemoryReader, MemoryReading, cuda_memory_reader
from glassbox.service.model.bert import BertClassifier
from glassbox.service.model.config import parse_config
from glassbox.service.types import EngineHealth, EngineResult, TokenBatch, WarmupReport

# all-MiniLM-L6-v2's shape, the default model's. Its CPU fallback of GPU_SHAPE took 2.2 s per batch on the 2 shared
# development cores (fp32); on the GPU machine's 16 cores it should be several times faster (not measured there),
# which keeps the eleven CPU batches of this check well inside its ~60 s.
GPU_MODEL = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536,
             "vocab_size": 30522}
REHEARSAL_MODEL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
                   "vocab_size": 2000}
GPU_SHAPE = (16, 256)  # the largest batch the default limits form: --max-batch-tokens 4096 at the longest length
REHEARSAL_SHAPE = (16, 64)
# Coarse filler chunks, 1 GiB down to 16 MiB: the caching allocator gives requests of 10 MB and more a segment of
# their own size, so each chunk takes exactly its size from the driver. The fine steps are 1 MiB blocks.
CHUNKS = tuple(2**k for k in range(30, 23, -1))
FINE_STEP = 2**20
MAX_FINE_STEPS = 4096


def model_of(dims: dict[str, int]) -> BertClassifier:
    raw = {"model_type": "bert", "architectures": ["BertForSequenceClassification"], "max_position_embeddings": 512,
           "type_vocab_size": 2, "id2label": {"0": "negative", "1": "positive"}, **dims}
    model = BertClassifier(parse_config(raw, source="gpu-check oom model"))
    model.init_weights(torch.Generator().manual_seed(0), std=0.02)
    return model.eval()


class CudaFiller:
    """Holds device memory in `torch.empty` chunks, and gives it all back."""

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self._chunks: list[torch.Tensor] = []

    @property
    def held_bytes(self) -> int:
        return sum(c.numel() for c in self._chunks)

    def free_bytes(self) -> int:
        free, _ = torch.cuda.mem_get_info(self.device)
        return int(free)

    def add(self, nbytes: int) -> bool:
        """One more chunk; False when the device has no room for it (any allocation failure the engine's own
        classifier calls an OOM; anything else propagates)."""
        try:
            self._chunks.append(torch.empty(nbytes, dtype=torch.uint8, device=self.device))
        except Exception as exc:
            if classify(exc) != "oom":
                raise
            return False
        return True

    def fill_to(self, leave_bytes: int) -> None:
        """Coarse: take chunks while more than `leave_bytes` would stay free."""
        torch.cuda.empty_cache()  # cached blocks would otherwise serve the batch that should run out of memory
        for chunk in CHUNKS:
            while self.free_bytes() - chunk >= leave_bytes and self.add(chunk):
                pass

    def free(self) -> None:
        self._chunks.clear()
        torch.cuda.empty_cache()


class SimulatedGpu:
    """The rehearsal's GPU: a CPU engine that raises torch's CUDA OutOfMemoryError when a batch needs more than the
    simulated free memory (measured in padded tokens), and reports simulated memory readings."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.free_tokens: int | None = None  # None: nothing filled

    @property
    def device(self) -> str:
        return "sim-gpu"

    @property
    def kind(self) -> str:
        return "simulated-gpu"

    def warmup(self) -> WarmupReport:
        return dataclasses.replace(self.inner.warmup(), device=self.device, kind=self.kind)

    def run(self, batch: TokenBatch) -> EngineResult:
        needed = batch.size * batch.max_length
        if self.free_tokens is not None and needed > self.free_tokens:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (simulated). Tried to allocate {needed} tokens' "
                                              f"worth; {self.free_tokens} free.")
        result = self.inner.run(batch)
        return EngineResult(result.logits, dataclasses.replace(result.timing, device=self.device))

    def health(self) -> EngineHealth:
        return EngineHealth(True, self.device, self.kind)

    def reading(self) -> MemoryReading:
        used = 99 if self.free_tokens is not None else 30
        return MemoryReading(used, 0, 100)


@dataclass
class Rig:
    """What differs between the real run and the rehearsal: engines, how memory is filled and freed, readings."""

    primary: Engine
    secondary: Engine
    fill: Callable[[], dict[str, int]]
    free: Callable[[], None]
    reader: MemoryReader
    batch: TokenBatch


def cuda_rig(batch: TokenBatch) -> Rig:
    model = model_of(GPU_MODEL)
    primary = EagerEngine(model, "cuda:0", "fp16")  # a private fp16 copy on the device; `model` stays on the CPU
    secondary = EagerEngine(model, "cpu", "fp32")
    filler = CudaFiller("cuda:0")

    def fill() -> dict[str, int]:
        # The primary is warm by now (the traffic before), so the peak below is the batch's steady-state need.
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        primary.run(batch)
        peak = torch.cuda.max_memory_allocated() - base  # what one run of the batch allocates
        filler.fill_to(2 * peak)
        # Fine: 1 MiB more at a time until the batch itself no longer fits. Calibrating on the batch, rather than
        # trusting the peak, covers what the peak misses (the allocator's rounding, library workspaces).
        steps, short = 0, False
        while steps < MAX_FINE_STEPS:
            try:
                primary.run(batch)
            except Exception as exc:
                # Whatever form the failure takes (the allocator's OutOfMemoryError, or cuBLAS failing to allocate a
                # workspace, which surfaces as a plain RuntimeError), the engine's classifier decides, as it does
                # for the fallback engine.
                if classify(exc) != "oom":
                    raise
                short = True
                break
            steps += 1
            if not filler.add(FINE_STEP):
                break
        torch.cuda.empty_cache()
        return {"largest_batch_peak_bytes": int(peak), "filled_bytes": filler.held_bytes,
                "free_after_fill_bytes": filler.free_bytes(), "calibration_runs": steps, "batch_fits": int(not short)}

    return Rig(primary, secondary, fill, filler.free, cuda_memory_reader("cuda:0"), batch)


def rehearsal_rig(batch: TokenBatch) -> Rig:
    model = model_of(REHEARSAL_MODEL)
    primary = SimulatedGpu(EagerEngine(model, "cpu", "fp32", executor="python"))
    secondary = EagerEngine(model, "cpu", "fp32", executor="python")
    needed = batch.size * batch.max_length

    def fill() -> dict[str, int]:
        primary.free_tokens = needed // 2
        return {"simulated_tokens_needed": needed, "simulated_tokens_free": needed // 2, "batch_fits": 0}

    def free() -> None:
        primary.free_tokens = None

    return Rig(primary, secondary, fill, free, primary.reading, batch)
