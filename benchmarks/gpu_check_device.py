"""Device-level checks of the GPU check: the NVML lookup of torch's CUDA device (MIG included) and the
classification of real allocation failures by the engine's own classifier.

Imports only what the bare GPU machine has; nvidia-ml-py (`pynvml`) is imported when the NVML check runs.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import torch

from benchmarks.gpu_check_book import CheckBook
from glassbox.service.devices import bare_uuid, find_nvml_device
from glassbox.service.engines.faults import classify

# What each layer of the CUDA stack raises when it cannot allocate, as torch surfaces it: all must read as an OOM.
SYNTHETIC_OOMS: tuple[tuple[str, BaseException], ...] = (
    ("caching allocator", torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")),
    ("runtime", RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported")),
    ("cuBLAS workspace", RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")),
    ("cuDNN", RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED")),
)
NOT_OOMS: tuple[tuple[str, BaseException, str | None], ...] = (
    ("sticky", RuntimeError("CUDA error: an illegal memory access was encountered"), "cuda_fatal"),
    ("a bug", RuntimeError("Expected all tensors to be on the same device, but found cuda:0 and cpu"), None),
)
FILL_CHUNK = 1 << 30  # 1 GiB
FILL_FINE = 1 << 24  # 16 MiB


def nvml_lookup(book: CheckBook, rehearsal: bool) -> None:
    if rehearsal:
        book.skip("nvml_lookup", "needs NVML and a device; the lookup (MIG instances included) is unit-tested with "
                                 "an NVML double (tests/service/test_devices.py)")
        return
    try:
        nvml: Any = importlib.import_module("pynvml")
    except ImportError as exc:
        book.record("nvml_lookup", False, error=f"nvidia-ml-py is not importable: {exc}")
        return
    try:
        nvml.nvmlInit()
        try:
            uuid = str(torch.cuda.get_device_properties(0).uuid)
            found = find_nvml_device(nvml, uuid, 0)
            nvml_total = int(nvml.nvmlDeviceGetMemoryInfo(found.handle).total) if found is not None else 0
        finally:
            nvml.nvmlShutdown()
        torch_total = int(torch.cuda.mem_get_info(0)[1])
        same = found is not None and bare_uuid(found.uuid) == bare_uuid(uuid)
        ratio = nvml_total / torch_total if torch_total else 0.0
        book.record("nvml_lookup", same and 0.95 <= ratio <= 1.05, torch_uuid=uuid,
                    nvml_uuid=found.uuid if found else None, how=found.how if found else None,
                    mig=bool(found and found.how == "mig"), nvml_total_bytes=nvml_total,
                    torch_total_bytes=torch_total, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    except Exception as exc:
        book.error("nvml_lookup", exc)


def oom_classify(book: CheckBook, rehearsal: bool) -> None:
    """The classifier on every known shape of allocation failure; on a device, also on real ones."""
    shapes = {label: classify(error) for label, error in SYNTHETIC_OOMS}
    controls = {label: classify(error) for label, error, _ in NOT_OOMS}
    known = all(fault == "oom" for fault in shapes.values()) and all(
        controls[label] == expected for label, _, expected in NOT_OOMS)
    if rehearsal:
        book.record("oom_classify", known, synthetic=shapes, controls=controls,
                    note="real allocation failures need a device")
        return
    try:
        real = provoke_real_failures()
    except Exception as exc:
        book.error("oom_classify", exc, synthetic=shapes, controls=controls)
        return
    ok = known and all(entry["fault"] == "oom" for entry in real.values() if entry["raised"])
    ok = ok and real["oversized tensor"]["raised"]
    book.record("oom_classify", ok, synthetic=shapes, controls=controls, real=real)


def provoke_real_failures() -> dict[str, dict[str, Any]]:
    """An allocation larger than the device; then, with the device filled, a matmul on a fresh stream (cuBLAS
    needs a workspace for it, and may fail as CUBLAS_STATUS_ALLOC_FAILED). What each raised, and its class."""
    device = torch.device("cuda:0")
    found: dict[str, dict[str, Any]] = {}
    total = torch.cuda.mem_get_info(device)[1]
    found["oversized tensor"] = _attempt(lambda: torch.empty(2 * total, dtype=torch.uint8, device=device))
    a = torch.randn(512, 512, device=device, dtype=torch.float16)
    held: list[torch.Tensor] = []
    try:
        torch.cuda.empty_cache()
        for chunk in (FILL_CHUNK, FILL_FINE):
            while True:
                attempt = _attempt(lambda c=chunk: held.append(torch.empty(c, dtype=torch.uint8, device=device)))
                if attempt["raised"]:  # the filler's own last allocation failed: that must read as an OOM too
                    found[f"filling in {chunk >> 20} MiB chunks"] = attempt
                    break
        stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]

        def matmul() -> None:
            with torch.cuda.stream(stream):
                (a @ a).sum().item()

        found["matmul on a new stream, device full"] = _attempt(matmul)
    finally:
        held.clear()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    return found


def _attempt(call: Any) -> dict[str, Any]:
    try:
        call()
    except Exception as exc:
        return {"raised": True, "type": type(exc).__name__, "message": str(exc)[:200], "fault": classify(exc)}
    return {"raised": False, "fault": None}
