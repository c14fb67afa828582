"""The forward pass compiled ahead of time on the CPU: `torch.export` with a dynamic batch and length, then
AOTInductor, run from its package without the Python interpreter between ops. It is the successor torch names for
the TorchScript recording (service/engines/script.py), which torch 2.13 marks deprecated.

Measured on the same batches, interleaved (docs/benchmarks/2026-12-01-torch-successors.md): the same throughput as
TorchScript (1.00x) and the same held-out accuracy, but about 33 s of compilation at every start on 2 cores instead of
about 2 s of recording, and a C++ compiler at run time, which the runtime image does not carry. So it is not the
default; `--cpu-executor aoti` turns it on, and anything that keeps it from compiling falls back to the recording.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from glassbox.service.engines.script import Forward

log = logging.getLogger("glassbox.engine")
MAX_BATCH = 4096  # the compiled batch dimension's bound; far above any batch the batcher forms


class CompiledForward:
    """The compiled package behind the engine's forward signature: no mask means every position is real, and a
    model that reads token types always gets them (zeros for single texts)."""

    def __init__(self, run: Callable[..., Tensor], token_types: bool) -> None:
        self._run = run
        self._token_types = token_types

    def __call__(self, input_ids: Tensor, attention_mask: Tensor | None,
                 token_type_ids: Tensor | None = None) -> Tensor:
        mask = attention_mask if attention_mask is not None else torch.ones(input_ids.shape, dtype=torch.bool)
        if not self._token_types:
            out: Tensor = self._run(input_ids, mask)
            return out
        types = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
        typed: Tensor = self._run(input_ids, mask, types)
        return typed


def aoti_forward(module: nn.Module, max_length: int, *, token_types: bool = False) -> Forward | None:
    """The module exported and compiled for every batch size up to MAX_BATCH and length from 2 to `max_length`, or
    None (and one warning) when it cannot be: the engine then records it with TorchScript instead."""
    start = time.perf_counter()
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    length = torch.export.Dim("length", min=2, max=max(2, max_length))
    ids = torch.ones((2, 8), dtype=torch.int64)  # [batch, seq], any valid ids
    mask = torch.ones((2, 8), dtype=torch.bool)
    mask[1, 5:] = False  # one padded row
    example: tuple[Tensor, ...] = (ids, mask)
    if token_types:
        example = (ids, mask, torch.zeros((2, 8), dtype=torch.int64))
    shapes = tuple({0: batch, 1: length} for _ in example)
    # Export cannot follow attention's loop over the texts of a batch (BertClassifier.varlen_attention): the
    # compiled program attends on the padded grid with a mask instead.
    varlen = getattr(module, "varlen_attention", None)
    try:
        if varlen is not None:
            setattr(module, "varlen_attention", False)  # noqa: B010 (an attribute of BertClassifier, not of Module)
        with torch.inference_mode():
            exported = torch.export.export(module, example, dynamic_shapes=shapes)
        with tempfile.TemporaryDirectory(prefix="glassbox-aoti-") as workdir:
            package = torch._inductor.aoti_compile_and_package(
                exported, package_path=str(Path(workdir) / "forward.pt2"))
            run = torch._inductor.aoti_load_package(package)
    except Exception as exc:  # a missing compiler, an op export cannot trace: the recording still works
        log.warning("AOTInductor compilation failed (%s); recording the forward pass with TorchScript instead", exc)
        return None
    finally:
        if varlen is not None:
            setattr(module, "varlen_attention", varlen)  # noqa: B010
    log.info("forward pass compiled with AOTInductor in %.1f s", time.perf_counter() - start)
    return CompiledForward(run, token_types)
