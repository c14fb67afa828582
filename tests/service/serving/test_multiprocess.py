"""The multi-process layout for real: `python -m glassbox.service serve --workers 2` (a supervisor, one engine process
and two HTTP worker processes) with the tiny model, under load, with processes killed on purpose.

Waits poll the server over HTTP with a bound (a separate process cannot signal the test otherwise)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from glassbox.chaos.local import free_port

BOUND_S = 90.0
TEXTS = ["a very good movie", "the worst film and a boring plot", "great acting", "slow and sad", "fun music"]
ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def children(self) -> list[psutil.Process]:
        """The engine and the workers (multiprocessing's resource tracker is a child too, but not one of ours)."""
        return [child for child in psutil.Process(self.process.pid).children()
                if "spawn_main" in " ".join(child.cmdline())]

    def engine(self) -> psutil.Process:
        """The engine process: the one child that does not hold the TCP listener."""
        [engine] = [child for child in self.children() if not child.net_connections(kind="inet")]
        return engine

    def workers(self) -> list[psutil.Process]:
        return [child for child in self.children() if child.net_connections(kind="inet")]

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def wait_for(condition: object, what: str, served: Served, bound_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + bound_s
    while True:
        try:
            if condition():  # type: ignore[operator]
                return
        except (httpx.HTTPError, psutil.Error):
            pass
        assert served.process.poll() is None, f"the server exited while waiting until {what}:\n{served.text()}"
        assert time.monotonic() < deadline, f"timed out waiting until {what}:\n{served.text()[-4000:]}"
        time.sleep(0.1)  # polling another process, bounded by the deadline


def ready(url: str) -> bool:
    return httpx.get(url + "/readyz", timeout=5).status_code == 200


def all_ready(url: str) -> bool:
    """Ready on 20 new connections in a row: the kernel hands each to one of the workers, so (short of a 1 in 500,000
    draw) both answered."""
    return all(ready(url) for _ in range(20))


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    port = free_port()
    log = tmp_path_factory.mktemp("multiprocess") / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLASSBOX_")}
    argv = [sys.executable, "-m", "glassbox.service", "serve", "--model", str(tiny_model_dir), "--device", "cpu",
            "--port", str(port), "--threads", "1", "--max-length", "32", "--length-buckets", "16,32",
            "--batch-buckets", "1,8", "--workers", "2", "--log-format", "text", "--drain-timeout-s", "10",
            "--log-requests", "all"]  # which worker answered is read from every request's line
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    server = Served(process, f"http://127.0.0.1:{port}", log)
    try:
        wait_for(lambda: ready(server.url), "the server is ready", server)
        yield server
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(BOUND_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def counter(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(\{{.*\}})? ([0-9.e+]+)", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            total += float(match.group(2))
    return total


async def load(url: str, requests: int, clients: int, statuses: list[tuple[int, dict[str, str], str]]) -> None:
    """`clients` clients, each on connections of its own (closed after every request, so the kernel spreads them over
    both workers), sending one text at a time."""
    queue = iter(range(requests))

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as c:
            for i in queue:
                response = await c.post("/predict", json={"inputs": TEXTS[i % len(TEXTS)]})
                statuses.append((response.status_code, dict(response.headers), response.text))

    await asyncio.gather(*(client() for _ in range(clients)))


def test_every_scrape_shows_the_whole_server_and_counters_never_go_back(served: Served) -> None:
    before = counter(httpx.get(served.url + "/metrics").text, "glassbox_requests_total", route="/predict")
    statuses: list[tuple[int, dict[str, str], str]] = []
    seen: list[float] = []

    async def scrape_while_loading() -> None:
        loading = asyncio.ensure_future(load(served.url, 240, 6, statuses))
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as c:
            while not loading.done():
                text = (await c.get(served.url + "/metrics")).text
                seen.append(counter(text, "glassbox_requests_total", route="/predict"))
                await asyncio.sleep(0.02)  # a scrape cadence, not a wait for a condition
        await loading

    asyncio.run(asyncio.wait_for(scrape_while_loading(), BOUND_S))
    after = httpx.get(served.url + "/metrics").text
    assert [s for s, _, _ in statuses] == [200] * 240
    assert len(seen) >= 5 and seen == sorted(seen), seen  # whichever worker answered, never backwards
    assert counter(after, "glassbox_requests_total", route="/predict") - before == 240
    # engine-side series (batches) and worker-side series (stages) are in the same scrape, and so are the
    # engine's scrape-time families (queued requests and tokens)
    assert counter(after, "glassbox_batch_size_count") >= 240 / 8
    assert counter(after, "glassbox_stage_duration_seconds_count", stage="infer") - before >= 240
    assert "\nglassbox_queue_requests " in after and "\nglassbox_queue_tokens " in after
    assert "glassbox_build_info{" in after and "_created" not in after
    answered = {m.group(1) for m in re.finditer(r"\[(worker-\d)\] glassbox\.request: POST /predict", served.text())}
    assert answered == {"worker-0", "worker-1"}, "both workers should have answered requests"


def test_what_the_model_answered_is_counted_in_the_engine_process_and_shows_in_every_scrape(served: Served) -> None:
    def predicted() -> dict[str, float]:
        text = httpx.get(served.url + "/metrics", timeout=30).text
        return {label: counter(text, "glassbox_predictions_total", label=label)
                for label in ("negative", "positive", "neutral")}

    wait_for(lambda: all_ready(served.url), "every worker is ready", served)
    before = predicted()
    answers = [httpx.post(served.url + "/v1/classify", json={"texts": TEXTS}, timeout=30).json() for _ in range(3)]
    labels = [result["label"] for answer in answers for result in answer["results"]]
    after = predicted()
    assert {label: after[label] - before[label] for label in after} == \
        {label: float(labels.count(label)) for label in after}


def test_a_scrape_shows_every_process_cpu_and_memory_by_role(served: Served) -> None:
    text = httpx.get(served.url + "/metrics").text
    pids = {"supervisor": served.process.pid, "engine": served.engine().pid,
            **{f"worker-{i}": None for i in range(2)}}
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_start_time_seconds",
                 "process_open_fds"):
        roles = set(re.findall(rf'^{name}{{process="([^"]+)"}} ', text, re.MULTILINE))
        assert roles == set(pids), (name, roles)
    # The engine's resident memory holds the model: it is this process's, not the answering worker's own.
    engine_rss = counter(text, "process_resident_memory_bytes", process="engine")
    assert engine_rss == pytest.approx(served.engine().memory_info().rss, rel=0.2)
    assert "python_info{" in text
    # `?name[]=` picks samples out of the whole server's scrape too: every process's, engine's included.
    picked = httpx.get(served.url + "/metrics", params={"name[]": ["process_open_fds", "glassbox_queue_requests"]})
    lines = [line for line in picked.text.splitlines() if not line.startswith("#")]
    assert {line.split("{")[0].split(" ")[0] for line in lines} == {"process_open_fds", "glassbox_queue_requests"}
    assert set(re.findall(r'^process_open_fds{process="([^"]+)"} ', picked.text, re.MULTILINE)) == set(pids)


def test_only_the_engine_process_loads_torch(served: Served) -> None:
    # The supervisor and the HTTP workers read the config and tokenizer and never run the model: torch would cost
    # each ~200 MB of resident memory and a second of start-up.
    def maps_torch(pid: int) -> bool:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()

    assert httpx.post(served.url + "/predict", json={"inputs": "good"}, timeout=30).status_code == 200
    assert maps_torch(served.engine().pid)
    assert [pid for pid in (served.process.pid, *(w.pid for w in served.workers())) if maps_torch(pid)] == []


def test_a_killed_worker_is_replaced_and_the_other_keeps_serving(served: Served) -> None:
    [victim, survivor] = served.workers()
    victim.kill()
    statuses = [httpx.post(served.url + "/predict", json={"inputs": "good"}, timeout=30).status_code
                for _ in range(20)]
    assert statuses == [200] * 20  # new connections go to the survivor (and soon to the replacement)
    wait_for(lambda: len(served.workers()) == 2 and victim.pid not in {w.pid for w in served.workers()},
             "the supervisor replaced the worker", served)
    assert survivor.is_running()
    assert re.search(rf"worker \d \(pid {victim.pid}\) exited with -9; replacing it", served.text())
    # Its counts stay in the scrape, folded with those of other dead processes: its own files are gone, so restarts
    # do not pile up files that every scrape reads.
    folder = Path(survivor.environ()["PROMETHEUS_MULTIPROC_DIR"])
    assert [f.name for f in folder.iterdir() if f.name.endswith(f"_{victim.pid}.db")] == []
    assert (folder / "counter_retired.db").exists()
    wait_for(lambda: all_ready(served.url), "every worker is ready", served)


def test_a_worker_killed_with_requests_in_the_engine_costs_only_its_own_clients(served: Served) -> None:
    """Under load every worker has requests in the engine's queue or its running batch. Killing one mid-way fails
    only the requests in flight on its own connections; the engine withdraws or finishes the rest of its requests,
    keeps running and answering the other worker's, and nothing is answered 5xx."""
    wait_for(lambda: all_ready(served.url), "every worker is ready", served)
    engine = served.engine()
    outcomes: list[int] = []  # status codes; -1 for a connection that broke under a request
    clients = 6

    async def client(requests: int) -> None:
        async with httpx.AsyncClient(base_url=served.url, timeout=30) as c:  # keep-alive: one worker's connection
            for i in range(requests):
                try:
                    response = await c.post("/predict", json={"inputs": TEXTS[i % len(TEXTS)]})
                except httpx.TransportError:
                    outcomes.append(-1)
                    continue
                outcomes.append(response.status_code)

    async def kill_under_load() -> None:
        loading = asyncio.gather(*(client(80) for _ in range(clients)))
        while len(outcomes) < 60:
            await asyncio.sleep(0.005)  # until every client is under way
        victim = served.workers()[0]
        victim.kill()
        await loading

    asyncio.run(asyncio.wait_for(kill_under_load(), BOUND_S))
    assert set(outcomes) <= {200, -1}, sorted(set(outcomes))
    assert outcomes.count(-1) <= clients  # at most the one request each client had in flight on the killed worker
    assert outcomes.count(200) >= clients * 80 - clients
    assert served.engine().pid == engine.pid  # the engine process never noticed more than a closed connection
    wait_for(lambda: all_ready(served.url), "the replacement is ready", served)
    assert httpx.post(served.url + "/predict", json={"inputs": "good"}, timeout=30).status_code == 200


def test_killing_the_engine_under_load_answers_503_and_the_engine_comes_back(served: Served) -> None:
    engine = served.engine()
    statuses: list[tuple[int, dict[str, str], str]] = []
    ok_before = counter(httpx.get(served.url + "/metrics").text, "glassbox_requests_total", status="200")

    async def kill_under_load() -> None:
        loading = asyncio.ensure_future(load(served.url, 400, 4, statuses))
        while len(statuses) < 40:
            await asyncio.sleep(0.01)  # until the load is well under way
        engine.kill()
        await loading

    asyncio.run(asyncio.wait_for(kill_under_load(), BOUND_S))
    codes = [status for status, _, _ in statuses]
    assert set(codes) <= {200, 503}, codes
    refused = [(headers, body) for status, headers, body in statuses if status == 503]
    assert refused, "requests made while the engine was down must have been answered 503"
    # engine_restarting from a worker that had seen the engine ready; not_ready (loading) from the worker that
    # replaced the one killed above if it first met the engine while the new one was loading. Both say when to retry.
    bad = [(h, b) for h, b in refused
           if not re.search(r'"code":"(engine_restarting|not_ready)"', b) or int(h.get("retry-after", 0)) < 1]
    assert not bad, bad[:3]
    assert any('"engine_restarting"' in b for _, b in refused)
    wait_for(lambda: all_ready(served.url), "the restarted engine is ready, and both workers know", served)
    new_engine = served.engine()
    assert new_engine.pid != engine.pid
    assert httpx.post(served.url + "/predict", json={"inputs": "good"}, timeout=30).status_code == 200
    assert re.search(rf"the engine process {engine.pid} exited with -9; starting it again", served.text())
    after = httpx.get(served.url + "/metrics").text
    assert counter(after, "glassbox_requests_total", status="200") - ok_before == codes.count(200) + 1
    assert counter(after, "glassbox_process_restarts_total", process="engine") == 1
    assert httpx.get(served.url + "/livez").status_code == 200  # one restart is well within the budget


def test_a_stopped_engine_costs_a_scrape_its_engine_values_not_the_scrape(served: Served) -> None:
    # Prometheus drops the whole target when a scrape outlasts its scrape_timeout (4 s in deploy/prometheus): a hung
    # engine must leave the workers' own series scrapeable, quickly.
    assert httpx.post(served.url + "/predict", json={"inputs": "good"}, timeout=30).status_code == 200
    engine = served.engine()
    engine.suspend()
    try:
        started = time.monotonic()
        reply = httpx.get(served.url + "/metrics", headers={"X-Prometheus-Scrape-Timeout-Seconds": "4"}, timeout=30)
        took = time.monotonic() - started
    finally:
        engine.resume()
    assert reply.status_code == 200
    assert "glassbox_requests_total" in reply.text  # the workers' own families
    assert "\nglassbox_queue_requests " not in reply.text  # the engine's scrape-time families could not come
    assert took < 2.5, f"the scrape took {took:.2f} s with the engine stopped"
    wait_for(lambda: all_ready(served.url), "every worker hears the engine again", served)
    assert "\nglassbox_queue_requests " in httpx.get(served.url + "/metrics").text


def test_killing_the_supervisor_takes_its_children_with_it(served: Served) -> None:
    # Last in this file: the shared server does not survive it.
    children = served.children()
    assert len(children) == 3
    served.process.kill()
    served.process.wait(BOUND_S)
    deadline = time.monotonic() + BOUND_S
    while any(child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in children):
        assert time.monotonic() < deadline, [c.pid for c in children if c.is_running()]
        time.sleep(0.1)  # polling other processes, bounded by the deadline


def test_chaos_faults_armed_through_a_worker_act_in_the_engine_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    token = "a-long-enough-chaos-token-for-this-test"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GLASSBOX_")}, "GLASSBOX_CHAOS_TOKEN": token}
    argv = [sys.executable, "-m", "glassbox.service", "serve", "--model", str(tiny_model_dir), "--device", "cpu",
            "--port", str(port), "--threads", "1", "--max-length", "32", "--workers", "2", "--chaos",
            "--log-format", "text", "--fallback-cooldown-s", "30", "--fallback-cooldown-max-s", "30"]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    server = Served(process, f"http://127.0.0.1:{port}", log)
    auth = {"Authorization": f"Bearer {token}"}
    try:
        wait_for(lambda: all_ready(server.url), "both workers are ready", server)
        # The supervisor checked the chaos token before starting anything, without the fault machinery and torch.
        assert "libtorch" not in Path(f"/proc/{server.process.pid}/maps").read_text()
        assert httpx.get(server.url + "/chaos/faults", timeout=30).status_code == 401  # the engine checks the token
        armed = httpx.post(server.url + "/chaos/faults", headers=auth, timeout=30,
                           json={"fault": "oom", "mode": "raise", "ttl_s": 60})
        assert armed.status_code == 201, armed.text
        # Every worker's requests go through the one engine: the simulated OOM is caught by the real fallback there.
        statuses = [httpx.post(server.url + "/predict", json={"inputs": "good"}, timeout=30).status_code
                    for _ in range(10)]
        assert statuses == [200] * 10
        wait_for(lambda: all(httpx.get(server.url + "/readyz", timeout=5).json()["reason"] == "oom"
                             for _ in range(20)), "every worker reports the engine's degradation", server)
        metrics = httpx.get(server.url + "/metrics", timeout=30).text
        assert counter(metrics, "glassbox_chaos_fault_active", fault="oom") == 1
        assert counter(metrics, "glassbox_fallback_events_total", reason="oom") == 1
        listed = httpx.get(server.url + "/chaos/faults", headers=auth, timeout=30).json()["faults"]
        assert [fault["fault"] for fault in listed] == ["oom"]
        assert httpx.delete(server.url + "/chaos/faults", headers=auth, timeout=30).status_code == 200
        # The OOM counter is counted as OOMs happen, in the engine process's metric file, which outlives it: a
        # restarted engine does not take it back to 0 (it was a tally read at scrape time).
        ooms = counter(metrics, "glassbox_gpu_oom_total", device="cpu")
        assert ooms >= 1
        # A fault lives in the engine process: it dies with it, and the log says so.
        assert httpx.post(server.url + "/chaos/faults", headers=auth, timeout=30,
                          json={"fault": "latency", "delay_ms": 1, "ttl_s": 600}).status_code == 201
        victim = server.engine()
        victim.kill()
        wait_for(lambda: not victim.is_running() or victim.status() == psutil.STATUS_ZOMBIE, "the engine died", server)
        wait_for(lambda: all_ready(server.url), "a new engine serves", server)
        after = httpx.get(server.url + "/metrics", timeout=30).text
        assert counter(after, "glassbox_gpu_oom_total", device="cpu") == ooms
        assert re.search(rf"the engine process {victim.pid} exited with -9; starting it again; chaos faults armed in "
                         "it are gone", server.text())
        assert httpx.get(server.url + "/chaos/faults", headers=auth, timeout=30).json() == {"faults": []}
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(BOUND_S)


def test_traces_kept_for_their_outcome_reach_the_collector_from_workers_and_the_engine(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """At ratio 0 with a latency SLO every request misses, each request is kept for its outcome in its worker, and
    the engine process exports the batch spans it held back for them when the worker says so (Keep)."""
    from tests.telemetry.otlp_receiver import http_receiver

    port, log = free_port(), tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GLASSBOX_", "OTEL_"))}
    env["POD_IP"] = "10.9.8.7"
    with http_receiver() as receiver:
        argv = [sys.executable, "-m", "glassbox.service", "serve", "--model", str(tiny_model_dir), "--device", "cpu",
                "--port", str(port), "--threads", "1", "--max-length", "32", "--length-buckets", "16,32",
                "--batch-buckets", "1,8", "--workers", "1", "--log-format", "text", "--otlp-endpoint",
                receiver.endpoint, "--trace-sample-ratio", "0", "--latency-slo-ms", "0.001"]
        with log.open("wb") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        served = Served(process, f"http://127.0.0.1:{port}", log)
        try:
            wait_for(lambda: ready(served.url), "the server is ready", served)
            answers = [httpx.post(served.url + "/v1/classify", json={"text": text}, timeout=30) for text in TEXTS[:3]]
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(BOUND_S)  # both processes flush their spans as they stop
        spans = receiver.spans()
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    servers = {(s.trace_id, s.span_id): s for s in spans if s.kind == "SPAN_KIND_SERVER"}
    batches = {(s.trace_id, s.span_id): s for s in spans if s.name == "engine.batch"}
    for answer in answers:
        _, trace_id, span_id, flags = answer.headers["traceresponse"].split("-")
        assert flags == "01", served.text()[-3000:]
        server = servers[(trace_id, span_id)]
        assert server.resource["service.instance.id"] == f"10.9.8.7:{port}"
        [infer] = [s for s in spans if s.name == "infer" and s.parent_span_id == span_id]
        assert infer.links, "the infer span links to its batches"
        for link in infer.links:  # each batch span came from the engine process, linked back to this request
            batch = batches[(link.trace_id, link.span_id)]
            assert (trace_id, span_id) in {(back.trace_id, back.span_id) for back in batch.links}
