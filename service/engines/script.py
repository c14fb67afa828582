"""Run our forward pass inside the TorchScript interpreter instead of Python, on the CPU.

Why: a server's event loop and the engine thread share one GIL. Run op by op from Python, the engine
needs the GIL between every two torch ops, so a busy event loop stalls it: with one Python thread
spinning beside it, the default model's eager throughput fell from ~360 to ~49 texts/s on the 2-core
development machine, while the same forward pass recorded with `torch.jit.trace` kept ~135 texts/s
(the spinner took the other core). The recorded graph is the same forward pass, op for op; tests check
its logits equal the Python path's.

torch marks torch.jit deprecated in favour of torch.compile/torch.export. Measured on the same batches
(docs/benchmarks/2026-12-01-torch-successors.md), torch.export + AOTInductor runs as fast as this recording
but compiles for ~33 s at every start and needs a C++ compiler at run time, so this stays the default and the
successor waits behind `--cpu-executor aoti` (service/engines/aoti.py).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

log = logging.getLogger("glassbox.engine")

Forward = Callable[[Tensor, Tensor | None, Tensor | None], Tensor]  # (ids, mask, token type ids) -> logits


class ScriptedForward:
    """Recordings of the module: with a padding mask, without (the no-padding fast path), and, for models that read
    token types, with a mask and type ids (text pairs; a pair batch without padding gets an all-true mask)."""

    def __init__(self, masked: torch.jit.ScriptModule, unmasked: torch.jit.ScriptModule,
                 typed: torch.jit.ScriptModule | None = None) -> None:
        self._masked = masked
        self._unmasked = unmasked
        self._typed = typed

    def __call__(self, input_ids: Tensor, attention_mask: Tensor | None,
                 token_type_ids: Tensor | None = None) -> Tensor:
        if token_type_ids is not None and self._typed is not None:
            if attention_mask is None:
                attention_mask = torch.ones(input_ids.shape, dtype=torch.bool, device=input_ids.device)
            out: Tensor = self._typed(input_ids, attention_mask, token_type_ids)
        elif attention_mask is None:
            out = self._unmasked(input_ids)
        else:
            out = self._masked(input_ids, attention_mask)
        return out


def _record(module: nn.Module, example: tuple[Tensor, ...]) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # type: ignore[attr-defined]
        traced = torch.jit.trace(module, example, check_trace=False)  # type: ignore[no-untyped-call]
        frozen: torch.jit.ScriptModule = torch.jit.freeze(traced.eval())
    return frozen


def script_forward(module: nn.Module, device: torch.device, *, token_types: bool = False) -> Forward | None:
    """The recorded forward pass, or None (and one warning) if this module cannot be recorded; the engine then
    runs the Python forward pass, which computes the same logits, only with more GIL traffic. `token_types` adds
    the recording with token type ids (models whose embeddings read them)."""
    ids = torch.ones((2, 8), dtype=torch.int64, device=device)  # [batch, seq], any valid ids
    mask = torch.ones((2, 8), dtype=torch.bool, device=device)
    mask[1, 5:] = False  # one padded row, so the recording includes the masking ops
    types = torch.zeros((2, 8), dtype=torch.int64, device=device)
    types[:, 4:] = 1  # a second segment, so the recording includes the type embedding lookup
    try:
        with torch.inference_mode():
            typed = _record(module, (ids, mask, types)) if token_types else None
            return ScriptedForward(_record(module, (ids, mask)), _record(module, (ids,)), typed)
    except Exception as exc:  # tracing failures are many and varied; the Python path is always available
        log.warning("TorchScript recording failed (%s); running the Python forward pass", exc)
        return None
