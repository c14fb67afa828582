"""GPU faults that hold real device memory: `oom` in fill mode and `fragmentation`.

Written and unit-tested on a CPU-only machine, against FakeMemory-style doubles of the DeviceMemory protocol below;
TorchCudaMemory and both routines ran once on a CUDA device (an H200, 2026-12-04: tests/chaos/test_gpu.py's gpu test,
through scripts/gpu-check.sh), not through a running server.

Both routines run in a worker thread (the control API calls them through asyncio.to_thread), never on the event
loop and never on the engine thread, so arming does not stall requests. Every torch call names the device
explicitly, because a worker thread's current CUDA device is its own. Allocations go to the device's default
stream, the one the engines compute on, so the blocks they hold (and the holes they leave) are the ones the
engine's own allocations compete with. What a routine allocated stays referenced by its MemoryHold until the fault
is disarmed or expires; releasing drops the references and empties the allocator's cache, so the memory goes back
to the driver (and the memory-pressure reading falls again).

- fill: empty the allocator's cache, then allocate until the device has `free_mib` free (cudaMemGetInfo). Near
  the end it may provoke allocator OOMs while it probes smaller chunks; torch counts them in `num_ooms`, but
  glassbox_gpu_oom_total does not (it counts the OOMs the engine's batches met). With the CPU fallback on, a small
  `free_mib` also trips its memory-pressure switch (device memory used above --memory-pressure-high), as a real
  squeeze would.
- fragmentation: allocate 2 MiB blocks (the caching allocator serves 1-10 MiB requests from 20 MiB segments, ten
  blocks each), then free every other one, leaving 2 MiB holes between live blocks: inactive split blocks, which a
  request above 2 MiB cannot use. The ratio reported is telemetry's: inactive_split_bytes / reserved_bytes from
  torch.cuda.memory_stats, for the whole process (the engine's own memory included).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

MIB = 1 << 20
BLOCK_BYTES = 2 * MIB
MAX_CHUNK_BYTES = 1024 * MIB  # big enough to fill 80 GB in under 100 steps, small enough to get close


@dataclass(frozen=True, slots=True)
class AllocatorStats:
    reserved_bytes: int  # held from the driver by the caching allocator
    allocated_bytes: int  # held by live tensors
    inactive_split_bytes: int  # free pieces of partly used segments

    @property
    def fragmentation_ratio(self) -> float:
        return self.inactive_split_bytes / self.reserved_bytes if self.reserved_bytes > 0 else 0.0


class DeviceMemory(Protocol):
    """What the routines need from one device's allocator."""

    def driver_free_bytes(self) -> int: ...

    def stats(self) -> AllocatorStats: ...

    def allocate(self, nbytes: int) -> object | None:  # None: out of memory
        ...

    def empty_cache(self) -> None: ...


class MemoryHold:
    """Blocks a GPU fault keeps alive while it is armed. Implements glassbox.chaos.faults.Hold."""

    def __init__(self, blocks: list[object], empty_cache: Callable[[], None]) -> None:
        self._blocks = blocks
        self._empty_cache = empty_cache
        self.bytes_held = 0

    def release(self) -> None:
        if not self._blocks:
            return
        self._blocks.clear()  # the last references: the allocator gets the blocks back now
        self._empty_cache()


def available_bytes(memory: DeviceMemory) -> int:
    """What our allocator could still hand out: the driver's free memory plus cached blocks no tensor uses."""
    stats = memory.stats()
    return memory.driver_free_bytes() + max(0, stats.reserved_bytes - stats.allocated_bytes)


def fill(memory: DeviceMemory, free_mib: int, *, max_chunk: int = MAX_CHUNK_BYTES,
         max_steps: int = 10_000) -> tuple[MemoryHold, dict[str, Any]]:
    """Allocate until the device has about `free_mib` free (cudaMemGetInfo: what nvidia-smi and the fallback
    engine's memory-pressure switch read), within a 2 MiB block, or 20 MiB where the allocator insists on a
    segment that size. Our allocator's wholly free cached segments go back to the driver first (as the fallback
    engine does before a probe), so they are filled too rather than left as a reserve the engine could still use;
    free pieces of partly used segments and of a CUDA graph pool stay, and `available_mib` counts them. Returns
    the hold and what was reached."""
    target = free_mib * MIB
    memory.empty_cache()
    blocks: list[object] = []
    held = 0
    chunk = max_chunk
    for _ in range(max_steps):
        size = min(chunk, memory.driver_free_bytes() - target) // BLOCK_BYTES * BLOCK_BYTES
        if size < BLOCK_BYTES:
            break
        block = memory.allocate(size)
        if block is None:
            chunk = size // 2  # what looked free was not (another process, segment rounding): probe smaller
            continue
        blocks.append(block)
        held += size
    hold = MemoryHold(blocks, memory.empty_cache)
    hold.bytes_held = held
    driver_free = memory.driver_free_bytes()
    detail = {"held_mib": round(held / MIB, 1), "driver_free_mib": round(driver_free / MIB, 1),
              "available_mib": round(available_bytes(memory) / MIB, 1),
              "reached": driver_free <= target + 20 * MIB}
    return hold, detail


def fragment(memory: DeviceMemory, inactive_mib: int) -> tuple[MemoryHold, dict[str, Any]]:
    """Leave about `inactive_mib` of inactive split blocks: allocate 2 x N + 1 blocks of 2 MiB, then free the even
    ones. All allocation comes first: freeing as it went would let the next allocation refill the last hole."""
    before = memory.stats()
    holes = -(-inactive_mib * MIB // BLOCK_BYTES)  # ceil
    blocks = _allocate_blocks(memory, 2 * holes + 1)
    kept = blocks[1::2]
    blocks.clear()  # drops the last references to the even blocks: they become the holes
    after = memory.stats()
    hold = MemoryHold(kept, memory.empty_cache)
    hold.bytes_held = len(kept) * BLOCK_BYTES
    added = after.inactive_split_bytes - before.inactive_split_bytes
    detail = {
        "fragmentation_ratio": round(after.fragmentation_ratio, 4),
        "fragmentation_ratio_before": round(before.fragmentation_ratio, 4),
        "inactive_split_mib": round(after.inactive_split_bytes / MIB, 1),
        "added_inactive_mib": round(added / MIB, 1),
        "reserved_mib": round(after.reserved_bytes / MIB, 1),
        "held_mib": round(hold.bytes_held / MIB, 1),
        "reached": added >= inactive_mib * MIB,
    }
    return hold, detail


def _allocate_blocks(memory: DeviceMemory, count: int) -> list[object]:
    """Up to `count` blocks of BLOCK_BYTES, fewer when memory runs out. A function of its own, so no local variable
    outlives the loop holding a block the caller means to free."""
    blocks: list[object] = []
    for _ in range(count):
        block = memory.allocate(BLOCK_BYTES)
        if block is None:
            break
        blocks.append(block)
    return blocks


class TorchCudaMemory:
    """DeviceMemory over torch's caching allocator for one CUDA device (run on a GPU by tests/chaos/test_gpu.py)."""

    def __init__(self, device: str) -> None:
        self._device = torch.device(device)

    def driver_free_bytes(self) -> int:
        free, _total = torch.cuda.mem_get_info(self._device)
        return int(free)

    def stats(self) -> AllocatorStats:
        raw = torch.cuda.memory_stats(self._device)
        return AllocatorStats(int(raw.get("reserved_bytes.all.current", 0)),
                              int(raw.get("allocated_bytes.all.current", 0)),
                              int(raw.get("inactive_split_bytes.all.current", 0)))

    def allocate(self, nbytes: int) -> object | None:
        try:
            return torch.empty(nbytes, dtype=torch.uint8, device=self._device)  # [nbytes]
        except torch.cuda.OutOfMemoryError:
            return None

    def empty_cache(self) -> None:
        with torch.cuda.device(self._device):
            torch.cuda.empty_cache()
