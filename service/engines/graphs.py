"""CUDA graph engine: replay captured graphs on fixed (batch, length) buckets, eager for anything larger.

The shape of vLLM's graph runner, in our own code:
- static input buffers allocated once (`graph_buffers.StaticBuffers`), refilled in place per batch;
- `warmup()` runs every bucket eagerly (side stream), then captures every bucket largest first into one
  shared memory pool, under `torch.inference_mode`, measuring the pool's memory and the capture time;
- `run()` looks the batch up in the `BucketTable`, pads it into the static buffers, replays, and copies
  only the real rows into a pinned host buffer in the model's dtype (the one synchronisation of the run),
  casting them to float32 there: a replayed batch allocates no device memory at all, so the memory-pressure
  switch can leave it on the GPU. A batch larger than every bucket runs eagerly and is counted by reason.

All torch.cuda calls sit behind a `Capturer` (graph_capture.py), so this class also runs on the CPU with
`EagerRehearsalCapturer`. The real capture/replay path is checked by scripts/gpu-check.sh on a GPU; it passed
on an H200 (docs/gpu-check.md).
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from typing import Literal

import numpy as np
import torch
from torch import nn

from glassbox.service.buckets import BucketTable
from glassbox.service.engines.base import attention_mask
from glassbox.service.engines.graph_buffers import BufferAddresses, StaticBuffers, check_addresses, empty_batch
from glassbox.service.engines.graph_capture import CapturedGraph, Capturer, CudaGraphCapturer, Forward
from glassbox.service.engines.graph_stats import CaptureReport, GraphCounters, GraphStats, fallback_reason
from glassbox.service.engines.sdpa import sdpa_backends
from glassbox.service.errors import EngineError
from glassbox.service.model.bert import BertClassifier
from glassbox.service.types import Bucket, EngineHealth, EngineResult, EngineTiming, TokenBatch, WarmupReport

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

log = logging.getLogger("glassbox.graphs")


def prepare_model(model: BertClassifier, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A private copy on `device` in `dtype`. A copy because `Module.to` moves in place, and the caller's
    model may still be needed on the CPU (the fallback engine is built from the same loaded model).
    The copy runs padded: packing real tokens (BertClassifier.unpad) depends on the data, and a captured graph
    replays fixed shapes."""
    private = copy.deepcopy(model)
    private.unpad = False
    return private.to(device=device, dtype=dtype).eval()


class CudaGraphEngine:
    def __init__(
        self,
        model: BertClassifier,
        device: str,
        dtype: Literal["fp32", "fp16", "bf16"],
        table: BucketTable,
        *,
        debug_buffers: bool = False,
        capturer: Capturer | None = None,
        warmup_iterations: int = 2,
    ) -> None:
        if table.max_length > model.config.max_tokens:
            raise ValueError(
                f"the longest bucket ({table.max_length}) exceeds the model's {model.config.max_tokens} positions"
            )
        self._device = torch.device(device)
        self._capturer = capturer if capturer is not None else CudaGraphCapturer(self._device)
        self._dtype = dtype
        self._model = prepare_model(model, self._device, DTYPES[dtype])
        self._config = model.config
        self._table = table
        self._debug = debug_buffers
        self._warmup_iterations = warmup_iterations
        self._buffers = StaticBuffers(table.max_batch, table.max_length, self._device, model.config.pad_token_id,
                                      token_types=model.config.uses_token_types)
        # Replayed logits land here, in the model's dtype, and are cast to float32 on the host: a cast on the device
        # would allocate there on every run. Pinned on CUDA, so the copy is a plain DMA.
        self._host_logits = torch.empty((table.max_batch, model.config.num_labels), dtype=DTYPES[dtype],
                                        pin_memory=self._device.type == "cuda")  # [max_batch, labels]
        self._graphs: dict[Bucket, CapturedGraph] = {}
        self._counters = GraphCounters()
        self._capture: CaptureReport | None = None
        self._report: WarmupReport | None = None
        self._addresses: BufferAddresses | None = None
        self._output_addresses: dict[Bucket, int] = {}

    @property
    def device(self) -> str:
        return str(self._device)

    @property
    def kind(self) -> str:
        # A stand-in capturer says so in the kind, so no label ever claims graphs that are not real.
        prefix = "graph" if self._capturer.name == "cuda" else f"graph-{self._capturer.name}"
        return f"{prefix}-{self._dtype}"

    @property
    def table(self) -> BucketTable:
        return self._table

    def warmup(self) -> WarmupReport:
        """Warm every bucket eagerly, then capture them all, largest first. Idempotent."""
        if self._report is not None:
            return self._report
        start = time.perf_counter()
        buckets = self._table.all()
        try:
            with torch.inference_mode():
                first = self._capturer.memory()
                forwards = {bucket: self._forward(bucket) for bucket in buckets}
                for bucket in buckets:
                    # Padding rows only (position 0 visible), laid out for this bucket's view: valid input.
                    self._buffers.fill(empty_batch(), bucket)
                    self._capturer.warm(forwards[bucket], self._warmup_iterations)
                self._capturer.settle()  # warm-up blocks returned, so the readings below bracket capture only
                before = self._capturer.memory()
                capture_start = time.perf_counter()
                for bucket in buckets:
                    self._buffers.fill(empty_batch(), bucket)
                    self._graphs[bucket] = self._capturer.capture(forwards[bucket])
                self._capturer.settle()
                capture_seconds = time.perf_counter() - capture_start
                after = self._capturer.memory()
        except BaseException:
            self._graphs.clear()  # a partial capture is not a usable engine
            raise
        config = self._config
        self._capture = CaptureReport(
            buckets=buckets,
            seconds=capture_seconds,
            pool_reserved_bytes=after.reserved - before.reserved,
            pool_allocated_bytes=after.allocated - before.allocated,
            reserved_before_warmup_bytes=first.reserved,
            reserved_after_warmup_bytes=before.reserved,
            reserved_after_capture_bytes=after.reserved,
            sdpa_backend=sdpa_backends(config.num_attention_heads, self._table.lengths, config.head_dim,
                                       DTYPES[self._dtype], self._device),
        )
        log.info("%s on %s: %d graphs captured in %.2fs; memory_reserved %s before warm-up, %s after it, %s after "
                 "capture; SDPA backend for the padded buckets: %s", self.kind, self.device, len(buckets),
                 capture_seconds, _mib(first.reserved), _mib(before.reserved), _mib(after.reserved),
                 self._capture.sdpa_backend)
        self._addresses = self._buffers.addresses()
        self._output_addresses = {bucket: graph.output.data_ptr() for bucket, graph in self._graphs.items()}
        self._report = WarmupReport(
            self.device, self.kind, buckets, time.perf_counter() - start,
            graph_pool_bytes=max(0, self._capture.pool_reserved_bytes),
        )
        return self._report

    def run(self, batch: TokenBatch) -> EngineResult:
        if not self._graphs:
            raise EngineError("the CUDA graph engine ran before warmup() captured its graphs")
        start = time.perf_counter_ns()
        n, width = batch.size, batch.max_length
        bucket = self._table.lookup(n, width)  # ValueError for an empty batch: a caller bug, not a fallback
        graph = self._graphs.get(bucket) if bucket is not None else None
        if bucket is None or graph is None:
            self._counters.fell_back(fallback_reason(n, width, self._table))
            return self._run_eager(batch, start)
        with torch.inference_mode():
            self._buffers.fill(batch, bucket)
            output = graph.replay()  # [bucket.batch, labels], the graph's static output
            host = self._host_logits[:n]  # [n, labels], model dtype
            host.copy_(output[:n])  # same dtype, contiguous: no device memory; on CUDA the run's one sync
            # copy=True: a fresh array, so the next run cannot overwrite logits already handed out.
            logits = host.to(dtype=torch.float32, copy=True).numpy()  # [n, labels]
        if self._debug:
            self._check_buffers(bucket, graph)
        self._counters.replayed(bucket)
        end = time.perf_counter_ns()
        timing = EngineTiming(start, end, self.device, "graph", n, batch.real_tokens, bucket.tokens, bucket)
        return EngineResult(logits=logits, timing=timing)

    def replays(self, batch: TokenBatch) -> bool:
        """Whether `run(batch)` would replay a captured graph (allocating no device memory), not run eagerly."""
        if batch.size == 0 or not self._graphs:
            return False
        bucket = self._table.lookup(batch.size, batch.max_length)
        return bucket is not None and bucket in self._graphs

    def run_padded_eager(self, batch: TokenBatch) -> np.ndarray:
        """The private model run eagerly on `batch` padded to its bucket, in the same static buffers: the same
        kernels on the same inputs as the replay, so a correct capture reproduces these logits bit for bit (the GPU
        check's exact parity). For checks only: it allocates on the device like any eager run."""
        bucket = self._table.lookup(batch.size, batch.max_length)
        if bucket is None:
            raise ValueError(f"a batch of {batch.size} texts up to {batch.max_length} tokens fits no bucket")
        with torch.inference_mode():
            self._buffers.fill(batch, bucket)
            output = self._forward(bucket)()  # [bucket.batch, labels]
            logits: np.ndarray = output[: batch.size].to(device="cpu", dtype=torch.float32, copy=True).numpy()
        return logits

    def stats(self) -> GraphStats:
        return self._counters.snapshot(self._capture)

    def health(self) -> EngineHealth:
        if self._report is None:
            return EngineHealth(ok=False, device=self.device, kind=self.kind, detail="graphs not captured yet")
        stats = self.stats()
        detail = (
            f"{len(self._graphs)} graphs; {stats.replays_total} replays, "
            f"{stats.eager_fallbacks_total} eager fallbacks"
        )
        return EngineHealth(ok=True, device=self.device, kind=self.kind, detail=detail)

    def _forward(self, bucket: Bucket) -> Forward:
        # The views are bound now, at capture time: a replay must read exactly these tensors, never a
        # late-bound attribute that could be swapped for another allocation.
        ids, mask = self._buffers.views(bucket)  # [b, s] int64, [b, s] bool
        return functools.partial(self._model, ids, mask, self._buffers.type_view(bucket))  # types [b, s] or None

    def _run_eager(self, batch: TokenBatch, start: int) -> EngineResult:
        width = batch.max_length
        with torch.inference_mode():
            ids = torch.from_numpy(np.ascontiguousarray(batch.ids[:, :width])).to(self._device)  # [n, width]
            mask_np = attention_mask(batch.lengths, width)
            mask = None if mask_np is None else torch.from_numpy(mask_np).to(self._device)  # [n, width]
            types = None if batch.type_ids is None else torch.from_numpy(
                np.ascontiguousarray(batch.type_ids[:, :width])).to(self._device)  # [n, width]
            logits = self._model(ids, mask, types).to(device="cpu", dtype=torch.float32, copy=True).numpy()
        end = time.perf_counter_ns()
        timing = EngineTiming(start, end, self.device, "eager", batch.size, batch.real_tokens,
                              batch.size * width, None)
        return EngineResult(logits=logits, timing=timing)

    def _check_buffers(self, bucket: Bucket, graph: CapturedGraph) -> None:
        assert self._addresses is not None  # set by warmup(), which run() requires
        output = (self._output_addresses[bucket], graph.output.data_ptr())
        check_addresses(self._addresses, self._buffers.addresses(), {f"output {bucket}": output})


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
