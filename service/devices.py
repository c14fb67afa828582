"""Which NVML device is torch's CUDA device: found by UUID, MIG instances included, never guessed.

CUDA and NVML number devices differently (CUDA_VISIBLE_DEVICES renumbers them, and CUDA may order the fastest
first), so an index is no key; the UUID is. NVML writes a whole GPU's UUID as `GPU-<uuid>` and a MIG instance's as
`MIG-<uuid>` (driver R470 and later); torch reports the same UUID with or without a prefix. So the lookup compares
bare UUIDs: first NVML's own by-UUID lookup with either prefix, then every GPU and every MIG instance on it. No
match means no NVML readings: a GPU that is not ours, picked by index, would make every GPU metric a lie.

`nvml` is the pynvml module (nvidia-ml-py) or a test double with the same calls. A leaf module: imports nothing
of the project, so telemetry (which exports the readings) and the GPU check (which runs it on a device) share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PREFIXES = ("GPU-", "MIG-")


@dataclass(frozen=True, slots=True)
class NvmlDevice:
    handle: Any
    uuid: str  # NVML's form, with its prefix ("" when found by index)
    how: str  # "uuid" (a whole GPU), "mig" (a MIG instance) or "index" (no UUID was known)


def bare_uuid(uuid: str) -> str:
    """"GPU-1a2b..." / "MIG-1a2b..." / "1a2b..." -> "1a2b...", lower case."""
    text = uuid.strip()
    for prefix in PREFIXES:
        if text.upper().startswith(prefix):
            text = text[len(prefix):]
    return text.lower()


def find_nvml_device(nvml: Any, cuda_uuid: str, index: int) -> NvmlDevice | None:
    """The NVML device whose UUID is `cuda_uuid` (torch's `get_device_properties(i).uuid`), or None.

    Without a UUID (torch could not say) the device at `index` is used, the one case an index is all there is."""
    if not cuda_uuid:
        return NvmlDevice(nvml.nvmlDeviceGetHandleByIndex(index), "", "index")
    want = bare_uuid(cuda_uuid)
    for prefix in PREFIXES:
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(prefix + want)
        except Exception:  # NVMLError_NotFound, or an old driver that knows no MIG UUIDs
            continue
        return NvmlDevice(handle, prefix + want, "mig" if prefix == "MIG-" else "uuid")
    for board in _boards(nvml):
        if bare_uuid(_uuid(nvml, board)) == want:
            return NvmlDevice(board, _uuid(nvml, board), "uuid")
        for instance in _mig_instances(nvml, board):
            if bare_uuid(_uuid(nvml, instance)) == want:
                return NvmlDevice(instance, _uuid(nvml, instance), "mig")
    return None


def _boards(nvml: Any) -> list[Any]:
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception:
        return []
    return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]


def _mig_instances(nvml: Any, board: Any) -> list[Any]:
    try:
        slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(board))  # NotSupported: not a MIG-capable board
    except Exception:
        return []
    instances = []
    for slot in range(slots):
        try:
            instances.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(board, slot))
        except Exception:  # NotFound: an empty slot
            continue
    return instances


def _uuid(nvml: Any, handle: Any) -> str:
    try:
        uuid = nvml.nvmlDeviceGetUUID(handle)
    except Exception:
        return ""
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
