"""The part of `torch.cuda` that CudaGraphCapturer calls, played on the CPU: streams with handles, a current-stream
stack, graph contexts that record their arguments, and memory readings that grow by one MiB per reading.

It captures nothing: a "graph" made here replays as a no-op. It exists to check the capturer's own bookkeeping
(which stream each warm-up and capture ran on, which pool and stream `graph()` was given, what was read when);
whether a real capture replays correctly is for the GPU check.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

MIB = 2**20


@dataclass
class FakeStream:
    cuda_stream: int
    waited_on: list[int] = field(default_factory=list)

    def wait_stream(self, other: FakeStream) -> None:
        self.waited_on.append(other.cuda_stream)


class FakeGraph:
    def replay(self) -> None:
        pass


class FakeCuda:
    def __init__(self) -> None:
        self.default = FakeStream(0)
        self.created: list[FakeStream] = []
        self.graph_calls: list[dict[str, Any]] = []
        self.pools = 0
        self.empties = 0
        self.readings = 0
        self._current = [self.default]

    def Stream(self, device: object) -> FakeStream:
        stream = FakeStream(1000 + len(self.created))
        self.created.append(stream)
        return stream

    def current_stream(self, device: object = None) -> FakeStream:
        return self._current[-1]

    @contextmanager
    def stream(self, stream: FakeStream) -> Iterator[None]:
        self._current.append(stream)
        try:
            yield
        finally:
            self._current.pop()

    def graph_pool_handle(self) -> tuple[str, int]:
        self.pools += 1
        return ("pool", self.pools)

    def CUDAGraph(self) -> FakeGraph:
        return FakeGraph()

    @contextmanager
    def graph(self, graph: FakeGraph, **kwargs: Any) -> Iterator[None]:
        self.graph_calls.append(kwargs)
        # torch.cuda.graph makes its capture stream current for the block, the given one or its own default.
        with self.stream(kwargs.get("stream") or FakeStream(-1)):
            yield

    @contextmanager
    def device(self, device: object) -> Iterator[None]:
        yield

    def synchronize(self, device: object = None) -> None:
        pass

    def empty_cache(self) -> None:
        self.empties += 1

    def memory_reserved(self, device: object = None) -> int:
        self.readings += 1
        return self.readings * MIB

    def memory_allocated(self, device: object = None) -> int:
        return 0
