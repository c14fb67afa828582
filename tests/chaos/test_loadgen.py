"""glassbox.chaos.loadgen: schedule math, bodies, the text mix, and open-loop runs against a live server on 127.0.0.1.

Runs are short (at most ~1 s of schedule) and assert on structure (counts, which request waited for what), never
on how fast this machine is. Where a test must wait for the generator to reach a point, it polls the generator's
own counters with a bound.
"""

from __future__ import annotations

import asyncio
import gc
import io
import itertools
import json
import math
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from glassbox.chaos.loadgen import LoadConfig, LoadGenerator, LoadResult, RatePlan, build_bodies, default_mix
from glassbox.chaos.loadgen.generator import SLICE_NS
from glassbox.chaos.loadgen.plan import BURST_FACTOR
from glassbox.chaos.loadgen.progress import Snapshot, show_progress
from glassbox.chaos.loadgen.slice import DEFAULT_SLICE, set_thread_slice, thread_slice_ns
from glassbox.chaos.loadgen.texts import SHAPES, read_texts
from glassbox.chaos.samples import ERROR_KINDS
from glassbox.service.app import create_app
from glassbox.service.wire import frames, json_api
from tests.chaos.slices import custom_slices
from tests.service.apptools import (
    BOUND_S,
    FakeEngine,
    LiveServer,
    RecordingObserver,
    app_settings,
    live_server,
    until,
    wait_ready,
)

TEXTS = ("good film", "a bad movie", "fun music and a long boring plot", "the best acting")


# --- the schedule ------------------------------------------------------------------------------------------------
def test_steady_spaces_requests_evenly() -> None:
    plan = RatePlan.steady(10, 1.0)
    assert list(plan.times()) == pytest.approx([i / 10 for i in range(10)])
    assert plan.count == 10
    assert plan.mean_rate == pytest.approx(10)


def test_step_climbs_in_four_equal_steps() -> None:
    plan = RatePlan.step(8, 4.0)
    assert plan.segments == ((0.0, 2.0), (1.0, 4.0), (2.0, 6.0), (3.0, 8.0))
    times = list(plan.times())
    assert plan.count == 2 + 4 + 6 + 8
    assert times[:2] == pytest.approx([0.0, 0.5])
    assert times[2:6] == pytest.approx([1.0, 1.25, 1.5, 1.75])
    assert times[6:12] == pytest.approx([2 + k / 6 for k in range(6)])
    assert times[12:] == pytest.approx([3 + k / 8 for k in range(8)])


def test_burst_has_periodic_bursts_at_four_times_the_rate() -> None:
    plan = RatePlan.burst(10, 20.0)  # period 10 s: bursts over [5, 6) and [15, 16)
    assert plan.segments == ((0.0, 10.0), (5.0, 40.0), (6.0, 10.0), (15.0, 40.0), (16.0, 10.0))
    assert plan.count == 10 * 18 + 40 * 2
    assert [plan.rate_at(t) for t in (0, 4.99, 5, 5.5, 6, 15.2, 16, 19.9, 20)] == [10, 10, 40, 40, 10, 40, 10, 10, 0]
    in_burst = [t for t in plan.times() if 5 <= t < 6]
    assert len(in_burst) == 40
    assert BURST_FACTOR == 4.0
    # A short run gets a shorter period, so it still holds two bursts.
    short = RatePlan.burst(10, 4.0)
    assert [start for start, rate in short.segments if rate == 40] == pytest.approx([1.0, 3.0])


def test_a_fractional_rate_carries_over_into_the_next_segment() -> None:
    plan = RatePlan(((0.0, 2.5), (1.0, 5.0)), 2.0)  # 2.5 due by t=1, so the 3rd request falls at 1 + 0.5/5
    assert list(plan.times()) == pytest.approx([0.0, 0.4, 0.8, 1.1, 1.3, 1.5, 1.7, 1.9])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.05, 5.0), st.floats(0.0, 300.0)), min_size=1, max_size=5))
def test_request_i_is_due_where_the_integral_of_the_rate_reaches_i(parts: list[tuple[float, float]]) -> None:
    starts = [0.0]
    for width, _ in parts[:-1]:
        starts.append(starts[-1] + width)
    plan = RatePlan(tuple(zip(starts, (rate for _, rate in parts), strict=True)), starts[-1] + parts[-1][0])
    times = list(plan.times())
    assert all(b >= a for a, b in itertools.pairwise(times))
    assert all(0 <= t < plan.duration_s for t in times)
    for i, t in enumerate(times):
        assert plan.expected(t) == pytest.approx(i, abs=1e-6)
    assert len(times) == pytest.approx(math.ceil(plan.expected(plan.duration_s) - 1e-9), abs=1)


@pytest.mark.parametrize(("segments", "duration"), [
    ((), 1.0), (((0.5, 1.0),), 1.0), (((0.0, 1.0), (0.0, 2.0)), 1.0), (((0.0, 1.0), (2.0, 1.0)), 1.0),
    (((0.0, -1.0),), 1.0), (((0.0, 1.0),), 0.0), (((0.0, math.inf),), 1.0),
])
def test_bad_plans_are_refused(segments: tuple[tuple[float, float], ...], duration: float) -> None:
    with pytest.raises(ValueError):
        RatePlan(segments, duration)


# --- bodies and texts --------------------------------------------------------------------------------------------
def test_the_servers_own_decoders_read_the_bodies() -> None:
    texts = ["good film", "ünïcode ✓ text", ""]
    as_json = build_bodies(texts, "json")
    as_frames = build_bodies(texts, "frames")
    assert (as_json.path, as_json.content_type) == ("/v1/classify", "application/json")
    assert (as_frames.path, as_frames.content_type) == ("/v1/classify", frames.CONTENT_TYPE)
    for i, text in enumerate(texts):
        assert json_api.decode(as_json.bodies[i], max_texts=1).texts == (text,)
        if text:
            assert frames.decode(as_frames.bodies[i], max_texts=1).texts == (text,)
    assert as_json[len(texts)] == as_json.bodies[0]  # requests cycle through the bodies


def test_the_built_in_mix_is_seeded_and_spread_over_lengths() -> None:
    mix = default_mix(seed=1)
    assert mix == default_mix(seed=1)
    assert mix != default_mix(seed=2)
    words = [len(text.split()) for text in mix]
    short = sum(w < 15 for w in words) / len(mix)
    long = sum(w >= 60 for w in words) / len(mix)
    assert [share for share, *_ in SHAPES] == [0.50, 0.35, 0.15]
    assert 0.40 < short < 0.60  # one-sentence texts: ~50%
    assert 0.08 < long < 0.22  # 6-14 sentences: ~15%
    assert len(set(mix)) > 0.9 * len(mix)


def test_texts_file_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "texts.txt"
    path.write_text("one\n\n  \ntwo\n", encoding="utf-8")
    assert read_texts(path) == ("one", "two")
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="holds no texts"):
        read_texts(path)
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ValueError, match="is not UTF-8 text"):  # named, not the decoder's byte offset
        read_texts(path)


@pytest.mark.parametrize("overrides", [
    {"target": "ftp://127.0.0.1"}, {"target": "127.0.0.1:80"}, {"connections": 0}, {"timeout_s": 0},
    {"max_outstanding": 0}, {"texts": ()}, {"protocol": "xml"},
])
def test_bad_configs_are_refused(overrides: dict[str, Any]) -> None:
    values: dict[str, Any] = {"target": "http://127.0.0.1:1", "plan": RatePlan.steady(1, 1)}
    values.update(overrides)
    with pytest.raises(ValueError):
        LoadConfig(**values)


# --- against a live server ---------------------------------------------------------------------------------------
@contextmanager
def served(tiny_model_dir: Path, *, hold: bool = False) -> Iterator[tuple[LiveServer, FakeEngine, RecordingObserver]]:
    """The app with a fake engine (held when asked) and a recording observer, under uvicorn on 127.0.0.1. A held
    engine's first batch seems to take as long as the hold, so the queue-wait bound is wide: these tests are about
    the load generator, not admission."""
    engine = FakeEngine(hold_runs=hold)
    observer = RecordingObserver()
    settings_ = app_settings(tiny_model_dir, max_queue_requests=4096, max_queue_wait_ms=60_000)
    app = create_app(settings_, engine=engine, observer=observer)
    with live_server(app, settings_, before_stop=engine.release) as live:
        wait_ready(lambda path: httpx.get(live.base_url + path, timeout=BOUND_S))
        yield live, engine, observer


def served_ok(observer: RecordingObserver) -> int:
    return sum(1 for r in observer.requests if r.route == "/v1/classify" and r.status == 200)


def run(generator: LoadGenerator, *, beside: Callable[[LoadGenerator], Awaitable[None]] | None = None,
        **kwargs: Any) -> LoadResult:
    async def scenario() -> LoadResult:
        helper = asyncio.ensure_future(beside(generator)) if beside else None
        result = await generator.run(**kwargs)
        if helper is not None:
            await helper
        return result

    return asyncio.run(asyncio.wait_for(scenario(), BOUND_S))


def check_accounting(result: LoadResult) -> None:
    assert result.recorded == len(result.samples) == result.scheduled - result.cancelled
    assert result.ok + sum(result.errors.values()) == result.recorded
    assert set(result.errors) == set(ERROR_KINDS)


@pytest.mark.parametrize("protocol", ["json", "frames"])
def test_every_request_is_accounted_for_and_the_server_agrees(tiny_model_dir: Path, protocol: str) -> None:
    with served(tiny_model_dir) as (live, engine, observer):
        before = served_ok(observer)
        config = LoadConfig(live.base_url, RatePlan.steady(40, 1.0), protocol=protocol,  # type: ignore[arg-type]
                            texts=TEXTS, connections=4)
        seen: list[float] = []
        result = run(LoadGenerator(config), on_sample=lambda s: seen.append(s.intended_s))
        served_now = served_ok(observer) - before
        rows = len(engine.rows)
    check_accounting(result)
    assert result.planned == result.scheduled == 40 and result.cancelled == 0
    assert result.ok == 40 == served_now == rows  # one text per request, each one served once
    assert sorted(seen) == sorted(s.intended_s for s in result.samples) == pytest.approx([i / 40 for i in range(40)])
    assert all(s.status == 200 and s.latency_s > 0 for s in result.samples)
    out = result.to_json()
    assert out["counts"]["ok"] == 40 and out["latency_ms"]["p50"] > 0 and out["spectrum"][-1]["count"] == 40
    assert out["config"]["protocol"] == protocol and out["config"]["texts"] == "4 given texts"
    assert out["spectrum"][-1]["percentile"] == 100.0
    assert [row["count"] for row in out["spectrum"]] == sorted(row["count"] for row in out["spectrum"])


def test_the_built_in_mix_is_served(tiny_model_dir: Path) -> None:
    with served(tiny_model_dir) as (live, _engine, observer):
        result = run(LoadGenerator(LoadConfig(live.base_url, RatePlan.steady(20, 0.5), connections=2)))
        assert result.ok == 10 == served_ok(observer)
    assert result.config["texts"].startswith("built-in mix")


def test_a_stall_shows_up_in_the_latency_of_every_request_due_during_it(tiny_model_dir: Path) -> None:
    """No coordinated omission: the engine is held until the scheduler has released request k, so every request
    due before t_k finished after t_k, however early it was due, even those that could not be sent at all until
    the stall ended (only 2 connections). Measured from the moment it was sent, request 2 would look fast."""
    rate, k = 50.0, 25
    t_k = k / rate
    with served(tiny_model_dir, hold=True) as (live, engine, observer):
        generator = LoadGenerator(LoadConfig(live.base_url, RatePlan.steady(rate, 1.0), texts=TEXTS, connections=2))

        async def stall(gen: LoadGenerator) -> None:
            await until(lambda: gen.scheduled > k, f"request {k} is due")
            engine.release()

        result = run(generator, beside=stall)
        assert served_ok(observer) == result.ok == 50
    check_accounting(result)
    during = sorted((s for s in result.samples if s.intended_s < t_k - 1e-9), key=lambda s: s.intended_s)
    assert len(during) == k
    for sample in during:
        assert sample.done_s >= t_k, sample
        assert sample.latency_s >= t_k - sample.intended_s
    assert during[2].latency_s >= t_k - 2 / rate  # queued behind both busy connections, the stall still counts


def test_requests_past_their_timeout_are_timeouts(tiny_model_dir: Path) -> None:
    with served(tiny_model_dir, hold=True) as (live, _engine, _observer):
        config = LoadConfig(live.base_url, RatePlan.steady(20, 0.5), texts=TEXTS, connections=2, timeout_s=0.3)
        result = run(LoadGenerator(config))
    check_accounting(result)
    assert result.cancelled == 0  # each ended by its own timeout, none had to be cut off by the drain
    assert result.errors["timeout"] == 10 and result.ok == 0
    assert all(s.error == "timeout" and s.status == 0 and s.latency_s >= 0.3 - 1e-3 for s in result.samples)
    assert result.percentiles() == {} and result.to_json()["spectrum"] == []


def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections to it are refused
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        result = run(LoadGenerator(LoadConfig(url, RatePlan.steady(20, 0.3), texts=TEXTS, connections=2)))
    check_accounting(result)
    assert result.errors["connect"] == 6 == result.recorded
    assert result.answered == 0 and result.achieved_rate == 0


def test_requests_beyond_max_outstanding_are_backlog_and_never_sent(tiny_model_dir: Path) -> None:
    with served(tiny_model_dir, hold=True) as (live, engine, observer):
        config = LoadConfig(live.base_url, RatePlan.steady(40, 0.5), texts=TEXTS, connections=1, max_outstanding=2)
        generator = LoadGenerator(config)

        async def hold_until_all_due(gen: LoadGenerator) -> None:
            await until(lambda: gen.scheduled == gen.planned, "every request is due")
            engine.release()

        result = run(generator, beside=hold_until_all_due)
        assert served_ok(observer) == 2
    check_accounting(result)
    assert (result.ok, result.errors["backlog"]) == (2, 18)  # one on the connection, one queued behind it
    backlog = [s for s in result.samples if s.error == "backlog"]
    assert all(s.status == 0 and s.latency_s == 0 for s in backlog)
    assert min(s.intended_s for s in backlog) == pytest.approx(2 / 40)


@pytest.mark.parametrize("from_thread", [False, True], ids=["loop", "thread"])
def test_stop_ends_the_run_early(tiny_model_dir: Path, from_thread: bool) -> None:
    with served(tiny_model_dir) as (live, _engine, _observer):
        generator = LoadGenerator(LoadConfig(live.base_url, RatePlan.steady(50, 60.0), texts=TEXTS, connections=2))
        if from_thread:
            enough = threading.Event()

            def stop_when_enough() -> None:
                enough.wait(BOUND_S)
                generator.stop()

            stopper = threading.Thread(target=stop_when_enough)
            stopper.start()

            def on_sample(_sample: object) -> None:
                if generator.snapshot().recorded >= 5:
                    enough.set()

            result = run(generator, on_sample=on_sample)
            stopper.join(BOUND_S)
        else:
            async def stop_soon(gen: LoadGenerator) -> None:
                await until(lambda: gen.snapshot().recorded >= 5, "five answers")
                gen.stop()

            result = run(generator, beside=stop_soon)
    check_accounting(result)
    assert result.stopped and result.recorded >= 5
    assert result.scheduled < result.planned == 3000
    assert result.duration_s < 60
    with pytest.raises(RuntimeError, match="runs once"):
        run(generator)


def test_the_run_keeps_what_was_alive_at_its_start_out_of_the_collectors_way() -> None:
    """A full collection mid-run walks every import and stalls the generator, and that stall lands in the latency of
    every request in flight: during the run the heap alive at its start is frozen, and afterwards it is not."""
    gc.unfreeze()
    frozen: list[int] = []
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections to it are refused
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        result = run(LoadGenerator(LoadConfig(url, RatePlan.steady(20, 0.2), texts=TEXTS, connections=2)),
                     on_sample=lambda _: frozen.append(gc.get_freeze_count()))
    assert result.recorded == len(frozen) == 4
    assert min(frozen) > 10_000  # the modules imported, at least
    assert gc.get_freeze_count() == 0


@custom_slices
def test_the_run_asks_for_a_short_scheduler_slice_and_gives_it_back() -> None:
    """Woken while the server keeps every core busy, a generator with the kernel's slice waited for the next tick, and
    that wait counted in every latency: during the run its thread has a short slice, and afterwards the one it had."""
    set_thread_slice(DEFAULT_SLICE)
    before = thread_slice_ns()
    seen: list[int | None] = []
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections to it are refused
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        result = run(LoadGenerator(LoadConfig(url, RatePlan.steady(20, 0.2), texts=TEXTS, connections=2)),
                     on_sample=lambda _: seen.append(thread_slice_ns()))
    assert seen == [SLICE_NS] * 4
    assert result.slice_ns == SLICE_NS and result.to_json()["scheduler_slice_ms"] == 0.1
    assert thread_slice_ns() == before != SLICE_NS


def test_a_generator_stopped_before_it_starts_sends_nothing() -> None:
    generator = LoadGenerator(LoadConfig("http://127.0.0.1:1", RatePlan.steady(50, 60.0), texts=TEXTS))
    generator.stop()
    result = run(generator)
    assert (result.scheduled, result.recorded, result.duration_s) == (0, 0, 0.0)
    assert result.stopped and result.achieved_rate == 0


def test_progress_draws_the_last_state_when_cancelled() -> None:
    buffer = io.StringIO()
    state = Snapshot(1.0, 2.0, 10, 3, 3, 2, 1, 0)

    async def scenario() -> None:
        task = asyncio.ensure_future(show_progress(lambda: state, console=Console(file=buffer, width=120)))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert "sent 3/10  ok 2  errors 1" in buffer.getvalue()


def test_result_json_is_plain_json(tiny_model_dir: Path) -> None:
    with served(tiny_model_dir) as (live, _engine, _observer):
        result = run(LoadGenerator(LoadConfig(live.base_url, RatePlan.burst(20, 0.5), texts=TEXTS, connections=2,
                                              keep_samples=False)))
    out = json.loads(json.dumps(result.to_json()))
    assert result.samples == []
    assert out["counts"]["recorded"] == out["counts"]["planned"] == RatePlan.burst(20, 0.5).count
    assert {"p50", "p90", "p95", "p99", "p99.9", "p99.99", "max", "mean"} <= set(out["latency_ms"])
    assert out["config"]["plan"]["segments"][1][1] == 80.0
