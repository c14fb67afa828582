"""Shared pieces for the end-to-end app tests: settings, a gated fake engine, a recording observer, a reference
model run outside the server, a ready TestClient and a real uvicorn server on 127.0.0.1 in a background thread.

Nothing here sleeps to wait for something: waits are on threading primitives, or bounded polls of state that the
test itself cannot be told about (readiness over HTTP, the batcher's queue depth).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import uvicorn
from starlette.applications import Starlette
from starlette.testclient import TestClient

from glassbox.service.engines.eager import EagerEngine
from glassbox.service.model.loader import load_model
from glassbox.service.observer import BatchRecord, FallbackEvent, RequestRecord
from glassbox.service.serving.http_server import uvicorn_config
from glassbox.service.settings import Settings, load_settings
from glassbox.service.tokenizer import TextTokenizer
from glassbox.service.types import EngineHealth, EngineResult, EngineTiming, FloatArray, TokenBatch, WarmupReport

BOUND_S = 30.0  # the most any wait may take; only reached when a test is already failing
POLL_S = 0.005
LABELS = ("negative", "positive", "neutral")  # what tests/helpers.py writes into the tiny model's config


def app_settings(model_dir: Path, **overrides: Any) -> Settings:
    """Test settings: the tiny model on the CPU, short texts, small buckets; GLASSBOX_* variables ignored."""
    values: dict[str, Any] = {
        "model": str(model_dir),
        "device": "cpu",
        "max_length": 32,
        "length_buckets": (8, 16, 32),
        "batch_buckets": (1, 4, 8),
        "max_texts_per_request": 8,
        "drain_timeout_s": 5.0,
        "log_level": "warning",
        # gc.freeze is process-wide: a test process that starts hundreds of apps would keep every one it froze.
        # tests/service/test_gc_freeze.py checks the default.
        "gc_freeze": False,
    }
    values.update(overrides)
    return load_settings(values, environ={})


def wait_until(condition: Callable[[], bool], what: str, bound_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {bound_s}s waiting until {what}")
        time.sleep(POLL_S)  # a poll step, bounded by the deadline above


async def until(condition: Callable[[], bool], what: str, bound_s: float = BOUND_S) -> None:
    """wait_until for a coroutine: polls without blocking the event loop."""
    deadline = time.monotonic() + bound_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {bound_s}s waiting until {what}"
        await asyncio.sleep(POLL_S)  # a poll step, bounded by the deadline above


class FakeEngine:
    """Implements glassbox.service.engines.base.Engine for three labels: the one fake engine of the tests.

    logits of a row with real ids r (including [CLS] and [SEP]): [len(r), sum(r) % 17, max(r) % 5], so tests can
    predict them (`logits_of`, `expected_logits`). `warmup` and `run` each wait on a gate (open unless asked
    otherwise) so a test can hold the server in "loading" or hold the engine busy while work piles up. Every batch
    and row it is given is recorded; `fail_with[i]` makes the i-th batch raise. With `ns_per_token` each run reports
    that much engine time per real token (so a measured throughput is exact), else the time it really took; batch i
    reports `devices[i % len(devices)]` and `modes[i % len(modes)]`."""

    def __init__(self, *, hold_warmup: bool = False, hold_runs: bool = False, fail_warmup: str = "",
                 devices: tuple[str, ...] = ("cpu",), modes: tuple[str, ...] = ("eager",),
                 ns_per_token: int | None = None) -> None:
        self.warmup_gate = threading.Event()
        self.run_gate = threading.Event()
        if not hold_warmup:
            self.warmup_gate.set()
        if not hold_runs:
            self.run_gate.set()
        self.fail_warmup = fail_warmup
        self.fail_with: dict[int, Exception] = {}  # batch index -> what run() raises for it
        self.devices, self.modes, self.ns_per_token = devices, modes, ns_per_token
        self.batches: list[TokenBatch] = []  # every batch run() was given, in order
        self.rows: list[tuple[int, ...]] = []  # every row run() was given, in the order it got them
        self._seen = threading.Condition()

    @property
    def device(self) -> str:
        return self.devices[0]

    @property
    def kind(self) -> str:
        return "fake"

    def warmup(self) -> WarmupReport:
        if not self.warmup_gate.wait(BOUND_S):
            raise RuntimeError("the test never released the fake engine's warm-up")
        if self.fail_warmup:
            raise RuntimeError(self.fail_warmup)
        return WarmupReport(self.device, self.kind, (), 0.0)

    def health(self) -> EngineHealth:
        return EngineHealth(True, self.device, self.kind)

    def run(self, batch: TokenBatch) -> EngineResult:
        start = time.perf_counter_ns()
        rows = rows_of(batch)
        with self._seen:
            index = len(self.batches)
            self.batches.append(batch)
            self.rows.extend(rows)
            self._seen.notify_all()
        if not self.run_gate.wait(BOUND_S):
            raise RuntimeError("the test never released the fake engine")
        if index in self.fail_with:
            raise self.fail_with[index]
        logits = expected_logits(batch)  # [n, 3]
        if self.ns_per_token is None:
            end = time.perf_counter_ns()
        else:
            start = time.perf_counter_ns()  # engine time starts when the gate opens
            end = start + self.ns_per_token * batch.real_tokens
        timing = EngineTiming(start, end, self.devices[index % len(self.devices)],
                              self.modes[index % len(self.modes)],  # type: ignore[arg-type]
                              batch.size, batch.real_tokens, batch.size * batch.max_length, None)
        return EngineResult(logits, timing)

    @staticmethod
    def logits_of(row: Sequence[int]) -> list[float]:
        return [float(len(row)), float(sum(row) % 17), float(max(row) % 5)]

    def wait_for_rows(self, count: int) -> None:
        """Block until run() has been handed at least `count` rows in all."""
        with self._seen:
            if not self._seen.wait_for(lambda: len(self.rows) >= count, BOUND_S):
                raise AssertionError(f"the engine got {len(self.rows)} rows, expected at least {count}")

    def wait_for_batches(self, count: int) -> None:
        """Block until run() has been entered `count` times in all."""
        with self._seen:
            if not self._seen.wait_for(lambda: len(self.batches) >= count, BOUND_S):
                raise AssertionError(f"the engine got {len(self.batches)} batches, expected at least {count}")

    def seen_ids(self) -> set[int]:
        return {token for row in self.rows for token in row}

    def release(self) -> None:
        self.warmup_gate.set()
        self.run_gate.set()


def rows_of(batch: TokenBatch) -> list[tuple[int, ...]]:
    """The real ids of each row of a batch."""
    return [tuple(int(v) for v in batch.ids[i, : batch.lengths[i]]) for i in range(batch.size)]


def expected_logits(batch: TokenBatch) -> FloatArray:
    """What FakeEngine answers for `batch`: [n, 3]."""
    rows = [FakeEngine.logits_of(row) for row in rows_of(batch)]
    logits: FloatArray = np.array(rows, dtype=np.float32).reshape(len(rows), 3)
    return logits


@dataclass
class RecordingObserver:
    """An Observer that keeps everything it is told."""

    requests: list[RequestRecord] = field(default_factory=list)
    batches: list[BatchRecord] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    dropped: list[tuple[str, int]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    fallbacks: list[FallbackEvent] = field(default_factory=list)

    def on_request(self, record: RequestRecord) -> None:
        self.requests.append(record)

    def on_batch(self, record: BatchRecord) -> None:
        self.batches.append(record)

    def on_rejected(self, reason: str) -> None:
        self.rejected.append(reason)

    def on_dropped(self, reason: str, items: int) -> None:
        self.dropped.append((reason, items))

    def on_aborted(self, reason: str) -> None:
        self.aborted.append(reason)

    def on_fallback(self, event: FallbackEvent) -> None:
        self.fallbacks.append(event)


class Reference:
    """The model run directly, outside the server: its own load, tokenizer and eager engine."""

    def __init__(self, model_dir: Path, max_length: int) -> None:
        loaded = load_model(model_dir)
        self.labels = loaded.labels
        self.tokenizer = TextTokenizer.from_file(loaded.tokenizer_file, max_length,
                                                 loaded.config.max_position_embeddings)
        self._engine = EagerEngine(loaded.model, "cpu")

    def tokens(self, texts: Sequence[str]) -> TokenBatch:
        return self.tokenizer.encode(list(texts))

    def logits(self, texts: Sequence[str]) -> FloatArray:
        # One text at a time, so the reference never depends on how the server happened to batch.
        rows = [self._engine.run(self.tokens([text])).logits[0] for text in texts]
        return np.stack(rows).astype(np.float32)  # [n, L]

    def probs(self, texts: Sequence[str]) -> FloatArray:
        probs: FloatArray = torch.softmax(torch.from_numpy(self.logits(texts)), dim=-1).numpy()  # [n, L]
        return probs

    def lengths(self, texts: Sequence[str]) -> list[int]:
        return [int(n) for n in self.tokens(texts).lengths]


def wait_ready(get: Callable[[str], Any]) -> None:
    """Poll /readyz (bounded) until it answers 200; `get(path)` returns a response with status_code and json()."""
    deadline = time.monotonic() + BOUND_S
    while True:
        response = get("/readyz")
        if response.status_code == 200:
            return
        assert response.json()["status"] == "loading", response.json()
        assert time.monotonic() < deadline, "the app never became ready"
        time.sleep(POLL_S)  # a poll step, bounded by the deadline above


@contextmanager
def ready_client(app: Starlette) -> Iterator[TestClient]:
    """A TestClient whose lifespan ran and whose warm-up finished."""
    with TestClient(app) as client:
        wait_ready(client.get)
        yield client


@dataclass
class LiveServer:
    app: Starlette
    port: int
    server: uvicorn.Server

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def live_server(app: Starlette, settings: Settings, *, before_stop: Callable[[], None] | None = None,
                on_abort: Callable[[str], None] | None = None) -> Iterator[LiveServer]:
    """The app under uvicorn, configured as `glassbox serve` configures it (uvloop, the slow-client guard), on a
    free port of 127.0.0.1, in a background thread. Returns once the server listens; readiness is the caller's.
    `before_stop` runs first on the way out (release a held fake engine there, or the drain would wait for it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = int(sock.getsockname()[1])
    config = uvicorn_config(app, settings.replace(host="127.0.0.1", port=port), on_abort or (lambda reason: None))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="live-uvicorn", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), "uvicorn started")
        assert thread.is_alive(), "uvicorn exited during start-up"
        yield LiveServer(app, port, server)
    finally:
        if before_stop is not None:
            before_stop()
        server.should_exit = True
        thread.join(BOUND_S)
        sock.close()
    assert not thread.is_alive(), "the live server did not stop"


def parse_server_timing(header: str) -> list[tuple[str, float]]:
    """`parse;dur=0.1, tokenize;dur=0.2` -> [("parse", 0.1), ("tokenize", 0.2)]."""
    entries = []
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        key, _, value = params.partition("=")
        assert key == "dur", f"Server-Timing entry without dur: {part!r}"
        entries.append((name, float(value)))
    return entries
