"""Which GPU failures the CPU fallback may absorb: out-of-memory, other recoverable CUDA errors, and the ones that
leave the CUDA context unusable until the process restarts.

Torch reports most CUDA failures as a RuntimeError (an AcceleratorError in recent versions) whose message carries
the CUDA or library status text, so the classification reads messages; the OutOfMemoryError class is checked first.
"""

from __future__ import annotations

from typing import Literal

import torch

from glassbox.service.errors import EngineError

GpuFault = Literal["oom", "cuda_error", "cuda_fatal"]

# Allocation failures, wherever in the CUDA stack they surface: the caching allocator, the runtime, cuBLAS or
# cuDNN creating a handle or a workspace. All of them mean "too little memory now", which a CPU rerun absorbs
# and which a later probe, after the cache is released, can recover from.
_OOM_MARKERS = (
    "cuda out of memory",
    "cuda error: out of memory",
    "cuda driver error: out of memory",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cudnn_status_not_initialized",  # cuDNN reports a failed handle allocation this way
)

# Sticky errors: once one happens every later CUDA call in the process fails too, so probing is pointless and the
# process must be restarted. Until the orchestrator does that, the CPU keeps answering.
_FATAL_MARKERS = (
    "device-side assert",
    "illegal memory access",
    "illegal instruction",
    "misaligned address",
    "unspecified launch failure",
    "launch timed out",
    "ecc error",
    "hardware stack error",
    "cuda error: unknown error",
    "gpu is lost",
    "fell off the bus",
)

# What marks a message as coming from the CUDA stack at all. A device-mismatch bug ("tensors on cuda:0 and cpu")
# is lower-case and is not one of these: it propagates like any other programming error.
_CUDA_MARKERS = ("CUDA error", "CUDA driver error", "CUBLAS_STATUS_", "CUDNN_STATUS_", "cuDNN error", "NVML")


def classify(error: BaseException) -> GpuFault | None:
    """The kind of GPU fault `error` reports, or None when it is not a CUDA failure (then it must propagate)."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return "oom"
    if not isinstance(error, RuntimeError):
        return None
    message = str(error)
    lowered = message.lower()
    if any(marker in lowered for marker in _OOM_MARKERS):
        return "oom"
    accelerator = getattr(torch, "AcceleratorError", None)
    from_cuda = (accelerator is not None and isinstance(error, accelerator)) or any(
        marker in message for marker in _CUDA_MARKERS
    )
    if not from_cuda:
        return None
    if any(marker in lowered for marker in _FATAL_MARKERS):
        return "cuda_fatal"
    # Not known to be sticky: serve from the CPU and let a probe find out whether the GPU works again.
    return "cuda_error"


def summary(error: BaseException, limit: int = 200) -> str:
    """One line for logs and health details: the type and the head of the message (OOM messages run long)."""
    text = " ".join(str(error).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return f"{type(error).__name__}: {text}"


class GpuStartupError(EngineError):
    """Every way of starting on the GPU failed with a CUDA fault (glassbox.service.engines.ladder). `fault` is the last
    one."""

    def __init__(self, message: str, fault: GpuFault) -> None:
        super().__init__(message)
        self.fault: GpuFault = fault


def startup_fault(error: BaseException) -> GpuFault | None:
    """The GPU fault behind a failed warm-up, or None when it is not one (then start-up must fail)."""
    if isinstance(error, GpuStartupError):
        return error.fault
    return classify(error)
