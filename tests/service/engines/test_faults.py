"""Which exceptions the fallback absorbs: the classification of CUDA failures, by type and by message."""

from __future__ import annotations

import pytest
import torch

from glassbox.service.engines.faults import classify, summary
from glassbox.service.errors import EngineError
from tests.service.engines.doubles import oom

ACCELERATOR = getattr(torch, "AcceleratorError", RuntimeError)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (oom(), "oom"),
        (torch.cuda.OutOfMemoryError("no message at all"), "oom"),
        (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"), "oom"),
        (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"), "oom"),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), "oom"),
        (RuntimeError("cuDNN error: CUDNN_STATUS_NOT_INITIALIZED"), "oom"),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), "cuda_fatal"),
        (RuntimeError("CUDA error: device-side assert triggered\nCompile with TORCH_USE_CUDA_DSA"), "cuda_fatal"),
        (RuntimeError("CUDA error: unspecified launch failure"), "cuda_fatal"),
        (RuntimeError("CUDA error: uncorrectable ECC error encountered"), "cuda_fatal"),
        (RuntimeError("CUDA error: misaligned address"), "cuda_fatal"),
        (RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx`"), "cuda_error"),
        (RuntimeError("CUDA error: operation not permitted when stream is capturing"), "cuda_error"),
        (ACCELERATOR("CUDA error: an illegal instruction was encountered"), "cuda_fatal"),
        (RuntimeError("Expected all tensors to be on the same device, but found cuda:0 and cpu!"), None),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x32 and 64x3)"), None),
        (ValueError("CUDA error: out of memory"), None),  # not a RuntimeError: not from torch's CUDA layer
        (EngineError("the CUDA graph engine ran before warmup()"), None),
    ],
)
def test_classify(error: BaseException, expected: str | None) -> None:
    assert classify(error) == expected


def test_summary_is_one_bounded_line_with_the_type() -> None:
    text = summary(RuntimeError("CUDA error: out of memory\n" + "x" * 500), limit=60)
    assert text.startswith("RuntimeError: CUDA error: out of memory x")
    assert "\n" not in text and len(text) == len("RuntimeError: ") + 60
