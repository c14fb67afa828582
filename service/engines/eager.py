"""Eager engine: the model run op by op, on the CPU (fp32 or int8) or on CUDA without graphs."""

from __future__ import annotations

import copy
import logging
import time
import warnings
from typing import Literal

import numpy as np
import torch
from torch import nn

from glassbox.service.engines.base import attention_mask
from glassbox.service.engines.script import Forward, script_forward
from glassbox.service.model.bert import BertClassifier
from glassbox.service.types import Bucket, EngineHealth, EngineResult, EngineTiming, TokenBatch, WarmupReport

log = logging.getLogger("glassbox.engine")

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def quantize_int8(model: BertClassifier) -> nn.Module:
    """Dynamic int8 quantization of the encoder's Linear layers: weights int8 with one scale per output channel,
    activations quantized per batch. Per-channel scales matter: with one scale per matrix the default model's
    held-out accuracy moved by up to 0.011 depending on how texts were batched. One matrix stays fp32 (see
    _int8_plan). The pooler and classifier stay fp32: they are tiny and sit right before the logits."""
    from torch.ao.quantization import quantize_dynamic

    quantized = copy.deepcopy(model)
    with warnings.catch_warnings():
        # torch marks torch.ao.quantization deprecated in favour of torchao. Measured
        # (docs/benchmarks/2026-12-01-torch-successors.md): torchao's int8 through torch.compile is as fast (0.99x)
        # but compiles for ~28 s at start and lost 0.0063 of held-out accuracy; this stays until those are paid down.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        quantized.layers = quantize_dynamic(  # type: ignore[no-untyped-call]
            quantized.layers, _int8_plan(quantized.layers), dtype=torch.qint8
        )
    return quantized


def _int8_plan(layers: nn.Module) -> dict[str, object]:
    """Which Linear layers become int8 (per-channel weights): all but the FIRST layer's feed-forward
    down-projection. Its input is the GELU output of the first layer, where the activation outliers are
    widest, and one activation scale per batch cannot cover them. Measured on the default model (held-out
    accuracy change against fp32, sorted 8 / sorted 32 / file-order 32): all Linear layers int8 -0.0031 /
    -0.0016 / -0.0102; layer 0's ffn_down kept fp32 -0.0031 / +0.0016 / +0.0016, at nearly the same speed
    (one of 36 matrices). Keeping any other single ffn_down fp32 did not bring file order within 0.01."""
    from torch.ao.quantization import per_channel_dynamic_qconfig

    return {
        name: per_channel_dynamic_qconfig
        for name, module in layers.named_modules()
        if isinstance(module, nn.Linear) and name != "0.ffn_down"
    }


class EagerEngine:
    """Pads each batch only to its own longest text (no buckets): on the CPU padding is pure waste."""

    def __init__(
        self,
        model: BertClassifier,
        device: str = "cpu",
        dtype: Literal["fp32", "fp16", "bf16"] = "fp32",
        quantize: Literal["none", "int8"] = "none",
        executor: Literal["torchscript", "python", "aoti"] = "torchscript",
        warmup_shapes: tuple[Bucket, ...] = (Bucket(1, 16), Bucket(8, 64)),
    ) -> None:
        if quantize == "int8" and device != "cpu":
            raise ValueError("int8 dynamic quantization runs on the CPU only")
        self._device = torch.device(device)
        module: nn.Module = model
        if quantize == "int8":
            module = quantize_int8(model)
        elif dtype != "fp32" or self._device.type != "cpu":
            # A private copy: the caller's CPU model must stay put (a CPU fallback engine may be built from it).
            module = copy.deepcopy(model).to(DTYPES[dtype])
            if self._device.type == "cpu" and isinstance(module, BertClassifier):
                # The head stays fp32 on the CPU: the same speed, and an eighth less mean logit error against fp32
                # on the built-in model (measured: docs/benchmarks/2026-12-07-bf16.md).
                module.pooler.float()
                module.classifier.float()
            if self._device.type != "cpu" and isinstance(module, BertClassifier):
                # Attention text by text is a CPU gain (no padded grid); on a GPU it would be a kernel launch per
                # text and layer, and a device sync for the offsets.
                module.varlen_attention = False
        self.model = module.to(self._device).eval()
        # On the CPU the forward pass runs recorded (see glassbox.service.engines.script for why); on CUDA the Python
        # path is only the no-graphs fallback, where the GIL matters far less than kernel launches.
        self._forward: Forward = self.model
        self.executor = "python"
        if executor == "aoti" and self._device.type == "cpu" and quantize == "none" and dtype == "fp32":
            from glassbox.service.engines.aoti import aoti_forward  # torch.export and Inductor load only when asked for

            compiled = aoti_forward(self.model, model.config.max_tokens, token_types=model.config.uses_token_types)
            if compiled is not None:
                self._forward, self.executor = compiled, "aoti"
        elif executor == "aoti":
            log.warning("--cpu-executor aoti compiles fp32 CPU models only; recording with TorchScript instead")
        if executor != "python" and self.executor == "python" and self._device.type == "cpu":
            scripted = script_forward(self.model, self._device, token_types=model.config.uses_token_types)
            if scripted is not None:
                self._forward, self.executor = scripted, "torchscript"
        self.num_labels = model.config.num_labels
        self._token_types = model.config.uses_token_types
        self._kind = f"eager-{quantize if quantize != 'none' else dtype}"
        # A model with few position embeddings cannot run the default warm-up lengths; warm what it can run.
        limit = model.config.max_tokens
        self._warmup_shapes = tuple(Bucket(shape.batch, min(shape.length, limit)) for shape in warmup_shapes)

    @property
    def device(self) -> str:
        return str(self._device)

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def concurrent(self) -> bool:
        """Whether several engine threads may run batches through it at once: on the CPU yes (the recorded forward
        pass keeps no state between calls and releases the GIL); on CUDA one stream serves one batch at a time."""
        return self._device.type == "cpu" and self.executor == "torchscript"

    def warmup(self) -> WarmupReport:
        start = time.perf_counter()
        with torch.inference_mode():
            for shape in self._warmup_shapes:
                ids = torch.zeros((shape.batch, shape.length), dtype=torch.int64, device=self._device)
                self._forward(ids, None, None)
        self._sync()
        return WarmupReport(self.device, self.kind, self._warmup_shapes, time.perf_counter() - start,
                            executor=self.executor)

    def run(self, batch: TokenBatch) -> EngineResult:
        start = time.perf_counter_ns()
        if batch.size == 0:  # nothing to compute; numpy cannot even build a mask for it
            empty = np.zeros((0, self.num_labels), dtype=np.float32)
            return EngineResult(empty, EngineTiming(start, time.perf_counter_ns(), self.device, "eager", 0, 0, 0, None))
        width = batch.max_length
        ids = torch.from_numpy(batch.ids[:, :width]).to(self._device, non_blocking=True)  # [n, width]
        mask_np = attention_mask(batch.lengths, width)
        mask = None if mask_np is None else torch.from_numpy(mask_np).to(self._device, non_blocking=True)
        types = None
        if batch.type_ids is not None and self._token_types:
            types = torch.from_numpy(batch.type_ids[:, :width]).to(self._device, non_blocking=True)  # [n, width]
        with torch.inference_mode():
            logits = self._forward(ids, mask, types).float().cpu().numpy()  # [n, labels]; .cpu() synchronises
        end = time.perf_counter_ns()
        timing = EngineTiming(start, end, self.device, "eager", batch.size, batch.real_tokens,
                              batch.size * width, None)
        return EngineResult(logits=logits, timing=timing)

    def health(self) -> EngineHealth:
        return EngineHealth(ok=True, device=self.device, kind=self.kind)

    def _sync(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
