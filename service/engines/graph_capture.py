"""The seam between the CUDA graph engine's bookkeeping and the torch.cuda calls that capture and replay.

`CudaGraphCapturer` is the real thing: eager warm-up on a side stream, capture into one shared memory
pool, replay. `EagerRehearsalCapturer` is its stand-in for machines without a GPU: it keeps the captured
callable and runs it again on every "replay", writing into the same static output tensor. The engine
cannot tell the two apart, so the CPU tests and `benchmarks/gpu_check.py --cpu-rehearsal` drive the real
engine end to end; what they cannot show is that a real capture replays correctly (that needs a GPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

Forward = Callable[[], Tensor]  # reads the static input buffers, returns logits [b, labels]


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """Caching-allocator totals on the engine's device, in bytes (0 on the CPU)."""

    reserved: int
    allocated: int


class CapturedGraph(Protocol):
    @property
    def output(self) -> Tensor:
        """The static output tensor every replay writes into: logits [b, labels]."""
        ...

    def replay(self) -> Tensor: ...


class Capturer(Protocol):
    @property
    def name(self) -> str:
        """"cuda" for real graphs, anything else for a stand-in (it shows up in the engine's kind)."""
        ...

    def warm(self, forward: Forward, iterations: int) -> None:
        """Run `forward` eagerly so lazy initialisation (kernels, workspaces) happens before capture."""
        ...

    def capture(self, forward: Forward) -> CapturedGraph: ...

    def settle(self) -> None:
        """Wait for queued work and return cached blocks, so that the next memory reading means something."""
        ...

    def memory(self) -> MemoryReading: ...


class _CudaGraph:
    def __init__(self, graph: Any, output: Tensor) -> None:
        self._graph = graph
        self._output = output

    @property
    def output(self) -> Tensor:
        return self._output

    def replay(self) -> Tensor:
        self._graph.replay()
        return self._output


class CudaGraphCapturer:
    """torch.cuda.CUDAGraph capture into one pool shared by every graph of the engine, on ONE side stream.

    The same stream serves every warm-up and every capture (`torch.cuda.graph(..., stream=...)`): each stream that
    runs a matmul gets a cuBLAS workspace of its own, which `empty_cache` never returns, so a stream per bucket plus
    torch's default capture stream would pin one workspace each. `stream_uses` records which stream each warm-up and
    capture actually ran on, so the GPU check can prove there was one.

    `cuda` is the torch.cuda module; tests hand in a double with the same calls, which lets the CPU suite drive
    this class's bookkeeping. On a real device it ran in scripts/gpu-check.sh on an H200 (docs/gpu-check.md).
    """

    name = "cuda"

    def __init__(self, device: torch.device, cuda: Any = None) -> None:
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {device}")
        self._device = device
        self._cuda: Any = cuda if cuda is not None else torch.cuda
        self._pool: Any = None  # created on first capture so constructing the engine touches no CUDA state
        self._stream: Any = None  # likewise, on first warm-up
        self.streams_created = 0
        self.stream_uses: list[tuple[str, int]] = []  # ("warm" | "capture", the current stream's handle)

    @property
    def stream(self) -> Any:
        if self._stream is None:
            self._stream = self._cuda.Stream(self._device)
            self.streams_created += 1
        return self._stream

    def warm(self, forward: Forward, iterations: int) -> None:
        # Warm-up work must not sit on the stream that later replays wait on, or allocator blocks from it can be
        # pulled into a graph: it runs on the side stream, which then captures.
        current = self._cuda.current_stream(self._device)
        side = self.stream
        side.wait_stream(current)
        with self._cuda.stream(side):
            self._note("warm")
            for _ in range(iterations):
                forward()
        current.wait_stream(side)

    def capture(self, forward: Forward) -> CapturedGraph:
        if self._pool is None:
            self._pool = self._cuda.graph_pool_handle()
        graph = self._cuda.CUDAGraph()
        # thread_local: only this thread's unsafe calls break the capture, so a metrics thread querying the
        # device meanwhile does not invalidate start-up.
        with self._cuda.device(self._device), self._cuda.graph(
            graph, pool=self._pool, stream=self.stream, capture_error_mode="thread_local"
        ):
            self._note("capture")
            output = forward()  # [b, labels], allocated from the graph's pool
        return _CudaGraph(graph, output)

    def settle(self) -> None:
        self._cuda.synchronize(self._device)
        self._cuda.empty_cache()

    def memory(self) -> MemoryReading:
        return MemoryReading(
            reserved=int(self._cuda.memory_reserved(self._device)),
            allocated=int(self._cuda.memory_allocated(self._device)),
        )

    def _note(self, what: str) -> None:
        self.stream_uses.append((what, int(self._cuda.current_stream(self._device).cuda_stream)))


class _RehearsedGraph:
    def __init__(self, forward: Forward, output: Tensor, log: list[str]) -> None:
        self._forward = forward
        self._output = output
        self._log = log
        self.replays = 0

    @property
    def output(self) -> Tensor:
        return self._output

    def replay(self) -> Tensor:
        # Like a real replay: recompute from whatever the static inputs hold now, into the same output.
        self._output.copy_(self._forward())
        self.replays += 1
        self._log.append("replay")
        return self._output


class EagerRehearsalCapturer:
    """Test double for `CudaGraphCapturer`, usable on any device. "Capture" runs the callable once and keeps
    it; "replay" runs it again. It records what the engine asked of it, in order, for tests to inspect."""

    name = "rehearsal"

    def __init__(self) -> None:
        self.log: list[str] = []  # "warm", "capture", "settle", "replay"
        self.capture_in_inference_mode: list[bool] = []
        self.graphs: list[_RehearsedGraph] = []

    def warm(self, forward: Forward, iterations: int) -> None:
        for _ in range(iterations):
            forward()
        self.log.append("warm")

    def capture(self, forward: Forward) -> CapturedGraph:
        self.capture_in_inference_mode.append(torch.is_inference_mode_enabled())
        graph = _RehearsedGraph(forward, forward(), self.log)
        self.graphs.append(graph)
        self.log.append("capture")
        return graph

    def settle(self) -> None:
        self.log.append("settle")

    def memory(self) -> MemoryReading:
        return MemoryReading(reserved=0, allocated=0)
