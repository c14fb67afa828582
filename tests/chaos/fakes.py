"""A model of torch's CUDA caching allocator, for testing the GPU memory faults on the CPU.

FakeMemory models what those routines rely on: requests of 1-10 MiB are served from 20 MiB segments, larger ones
from a segment of their own size; a request takes the best-fitting free block of any segment before asking the
driver; a freed block merges with free neighbours; inactive split bytes are the free blocks of segments that are
split; empty_cache returns wholly free segments to the driver. A block is freed when its last reference goes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from glassbox.chaos.gpu import MIB, AllocatorStats

SEGMENT = 20 * MIB


@dataclass
class Block:
    size: int
    used: bool = False


@dataclass
class Segment:
    blocks: list[Block] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(b.size for b in self.blocks)

    @property
    def split(self) -> bool:
        return len(self.blocks) > 1


class Handle:
    def __init__(self, memory: FakeMemory, block: Block) -> None:
        self._memory = memory
        self._block = block

    def __del__(self) -> None:
        self._memory.free(self._block)


class FakeMemory:
    def __init__(self, total_mib: int, *, overstate_free_mib: int = 0) -> None:
        self.total = total_mib * MIB
        self.segments: list[Segment] = []
        self.overstate = overstate_free_mib * MIB  # another process's memory the driver figure does not show yet
        self.failed = 0

    def driver_free_bytes(self) -> int:
        return self.total - sum(s.size for s in self.segments) + self.overstate

    def stats(self) -> AllocatorStats:
        reserved = sum(s.size for s in self.segments)
        used = sum(b.size for s in self.segments for b in s.blocks if b.used)
        inactive = sum(b.size for s in self.segments if s.split for b in s.blocks if not b.used)
        return AllocatorStats(reserved, used, inactive)

    def allocate(self, nbytes: int) -> object | None:
        fits = [(b.size, s, b) for s in self.segments for b in s.blocks if not b.used and b.size >= nbytes]
        if fits:
            _, segment, block = min(fits, key=lambda t: t[0])
        else:
            size = SEGMENT if nbytes < 10 * MIB else nbytes
            if size > self.total - sum(s.size for s in self.segments):
                self.empty_cache()
                if size > self.total - sum(s.size for s in self.segments):
                    self.failed += 1
                    return None
            block = Block(size)
            segment = Segment([block])
            self.segments.append(segment)
        if block.size > nbytes:
            index = segment.blocks.index(block)
            segment.blocks.insert(index + 1, Block(block.size - nbytes))
            block.size = nbytes
        block.used = True
        return Handle(self, block)

    def free(self, block: Block) -> None:
        block.used = False
        for segment in self.segments:
            if block in segment.blocks:
                merged: list[Block] = []
                for b in segment.blocks:
                    if merged and not merged[-1].used and not b.used:
                        merged[-1].size += b.size
                    else:
                        merged.append(b)
                segment.blocks = merged

    def empty_cache(self) -> None:
        self.segments = [s for s in self.segments if any(b.used for b in s.blocks)]
