"""What HTTP workers and the engine process say to each other, as msgspec structs encoded with msgpack.

Requests travel in bulk: a worker sends the requests of one turn of its event loop as one Submit, and the engine
process answers those that one batch finished as one Answers, so that neither side handles a message, a task or a
timer per request. Token ids travel as the raw bytes of their int64 arrays ([rows, width], right-padded; native byte
order: both ends are on one host), every request of a Submit in one buffer: encoding and decoding them is a memcpy,
not a loop. Times are
`time.perf_counter_ns()` readings; on Linux that clock is CLOCK_MONOTONIC, one clock for every process on the host,
so a worker can place the engine's queue and infer times on its own request timeline exactly.

Worker -> engine: Hello (once), Submit, Cancel, Call (a control-API request to run in the engine), Scrape, Keep.
Engine -> worker: State (on connect and on every change), Answers (a Done or a Refused for each request), Answer,
Scraped.
"""

from __future__ import annotations

import msgspec


class Hello(msgspec.Struct, tag=0, array_like=True, frozen=True):
    worker: int  # the worker's index (0..N-1), for logs
    pid: int


class Request(msgspec.Struct, array_like=True, frozen=True):
    """One request of a Submit: its token ids are the next `rows * width` of the Submit's `ids`."""

    id: int  # unique on its connection; the answer carries it back
    rows: int
    width: int
    deadline_ns: int  # absolute, perf_counter_ns
    request_id: str
    types: bool = False  # its token types are the next `rows * width` of the Submit's `type_ids`
    span: tuple[str, str, bool] | None = None  # the request's server span (trace id, span id, sampled)


class Submit(msgspec.Struct, tag=1, array_like=True, frozen=True):
    """Every request a worker submitted in one turn of its event loop, in one frame: the engine process admits them
    under one lock and answers them without a task, a future or a timer of their own."""

    requests: tuple[Request, ...]
    ids: bytes  # int64: each request's [rows, width] block (right-padded), one after another
    lengths: bytes  # int64: each request's rows, one after another
    type_ids: bytes = b""  # int64: the [rows, width] blocks of the requests with `types`, one after another


class Cancel(msgspec.Struct, tag=2, array_like=True, frozen=True):
    """The client of a request went away: drop whatever of it is still queued. No answer."""

    id: int


class Done(msgspec.Struct, tag=3, array_like=True, frozen=True):
    id: int
    labels: int
    logits: bytes  # float32, [rows, labels]
    queue_start_ns: int
    queue_end_ns: int  # the start of the first engine run holding one of its rows
    infer_end_ns: int  # the end of the last one
    device: str
    engine_mode: str
    batch_ids: tuple[int, ...]
    batch_spans: tuple[tuple[str, str, bool], ...] = ()  # the batches' spans (trace id, span id, sampled)


class Refused(msgspec.Struct, tag=4, array_like=True, frozen=True):
    """The request failed with a GlassboxError: its code and message, and Retry-After for overload."""

    id: int
    code: str
    message: str
    retry_after_s: float = 0.0


class State(msgspec.Struct, tag=5, array_like=True, frozen=True):
    """The engine's readiness, pushed to every worker when it connects and whenever it changes."""

    phase: str  # loading | ready | draining | stopped
    device: str
    degraded_reason: str  # "" unless a fallback serves
    live: bool
    live_reason: str
    generation: int  # the engine process's start count: 1 for the first, +1 per restart
    engine_kind: str = ""  # "eager-fp32", "fallback(...)": what /info reports
    # Seconds from now the engine process may not be heard from without being hung: the export of a torch profiler
    # trace holds its interpreter (service/http/profile.py). 0: the usual bound.
    quiet_s: float = 0.0


class Call(msgspec.Struct, tag=6, array_like=True, frozen=True):
    """An HTTP request for a route the engine process serves (the chaos control API), relayed by a worker."""

    id: int
    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes


class Answer(msgspec.Struct, tag=7, array_like=True, frozen=True):
    id: int
    status: int
    headers: list[tuple[str, str]]
    body: bytes


class Scrape(msgspec.Struct, tag=8, array_like=True, frozen=True):
    """Ask for the engine's scrape-time metric families (queue, GPU, allocator) in the Prometheus text format."""

    id: int


class Scraped(msgspec.Struct, tag=9, array_like=True, frozen=True):
    id: int
    text: bytes


class Keep(msgspec.Struct, tag=10, array_like=True, frozen=True):
    """Tracing kept a request for its outcome (a 5xx, a slow answer): export the spans of these batches it rode in,
    held back until now. No answer."""

    batch_ids: tuple[int, ...]


class Answers(msgspec.Struct, tag=11, array_like=True, frozen=True):
    """The requests of one worker that ended in one turn of the engine process's event loop (under load: those a
    batch finished), in one frame."""

    done: tuple[Done, ...] = ()
    refused: tuple[Refused, ...] = ()


ToEngine = Hello | Submit | Cancel | Call | Scrape | Keep
ToWorker = Answers | State | Answer | Scraped

encode = msgspec.msgpack.Encoder().encode


def engine_decoder() -> msgspec.msgpack.Decoder[ToEngine]:
    return msgspec.msgpack.Decoder(ToEngine)


def worker_decoder() -> msgspec.msgpack.Decoder[ToWorker]:
    return msgspec.msgpack.Decoder(ToWorker)
