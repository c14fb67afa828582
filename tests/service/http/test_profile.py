"""The profile API (service/http/profile.py) for real: `glassbox serve --profiling` with its token, in one process and
with workers; a profile of a few seconds taken under load with py-spy, read as speedscope reads it; a torch profiler
trace of the engine under load, read as Perfetto reads it; refusals without the token, for bad parameters, and while
another profile or trace runs; and a missing token refused at start."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from glassbox.chaos.local import free_port

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "profile-token-0123456789abcdef"
BOUND_S = 90.0

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="py-spy reads /proc (Linux)")


def serve(model: Path, port: int, log: Path, *extra: str, token: str | None = TOKEN) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLASSBOX_")}
    if token is not None:
        env["GLASSBOX_PROFILE_TOKEN"] = token
    argv = [sys.executable, "-m", "glassbox.service", "serve", "--model", str(model), "--device", "cpu", "--port",
            str(port), "--max-length", "32", "--length-buckets", "16,32", "--batch-buckets", "1,8", "--threads", "1",
            "--profiling", *extra]
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def wait_ready(process: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while True:
        assert process.poll() is None, "the server exited"
        try:
            if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the server never became ready"
        time.sleep(0.1)  # polling another process, bounded by the deadline


@pytest.fixture(scope="module", params=["0", "2"], ids=["one-process", "workers"])
def server(request: pytest.FixtureRequest, tiny_model_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("py-spy") is None and not (Path(sys.executable).parent / "py-spy").exists():
        pytest.fail("py-spy is a dependency of glassbox and must be installed")
    port = free_port()
    process = serve(tiny_model_dir, port, tmp_path_factory.mktemp("profile") / "serve.log", "--workers",
                    request.param)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(process, url)
        yield url
    finally:
        process.terminate()
        process.wait(BOUND_S)


def frame_names(profile: dict[str, object]) -> set[str]:
    return {str(frame["name"]) for frame in profile["shared"]["frames"]}  # type: ignore[index]


async def profile_under_load(url: str, seconds: float, path: str = "/debug/profile") -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=BOUND_S) as client:
        taking = asyncio.ensure_future(client.post(path, params={"seconds": seconds},
                                                   headers={"Authorization": f"Bearer {TOKEN}"}))
        while not taking.done():
            await asyncio.gather(*(client.post("/v1/classify", json={"texts": ["a good film", "a bad one"]})
                                   for _ in range(4)))
        return await taking


def test_a_profile_under_load_names_the_stages_and_every_process(server: str) -> None:
    response = asyncio.run(profile_under_load(server, 2))
    assert response.status_code == 200, response.text
    assert response.headers["content-disposition"].startswith("attachment")
    profile = json.loads(response.content)
    assert profile["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    assert profile["profiles"] and all(p["type"] == "sampled" for p in profile["profiles"])
    names = frame_names(profile)
    # The request path and the engine are both in it: the handler, tokenizing, and the batcher's engine thread.
    assert any("classify" in name for name in names), sorted(names)[:40]
    assert any("encode" in name for name in names)
    assert any("_work" in name or "_run" in name for name in names)


async def two_at_once(server: str, path: str) -> list[int]:
    """The statuses of a 2 s recording and of a second one asked for while the first runs."""
    async with httpx.AsyncClient(base_url=server, timeout=BOUND_S,
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        first = asyncio.ensure_future(client.post(path, params={"seconds": 2}))
        await asyncio.sleep(0.5)
        second = await client.post(path, params={"seconds": 1})
        return [(await first).status_code, second.status_code]


def test_the_profile_api_refuses_without_its_token_for_bad_seconds_and_while_one_runs(server: str) -> None:
    missing = httpx.post(server + "/debug/profile", params={"seconds": 1}, timeout=BOUND_S)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "unauthorized"
    wrong = httpx.post(server + "/debug/profile", params={"seconds": 1}, timeout=BOUND_S,
                       headers={"Authorization": "Bearer not-the-token-at-all"})
    assert wrong.status_code == 401
    for seconds in ("0", "61", "soon"):
        bad = httpx.post(server + "/debug/profile", params={"seconds": seconds}, timeout=BOUND_S,
                         headers={"Authorization": f"Bearer {TOKEN}"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_parameter", seconds

    assert asyncio.run(two_at_once(server, "/debug/profile")) == [200, 409]


def test_a_trace_under_load_holds_the_engine_threads_operators(server: str) -> None:
    response = asyncio.run(profile_under_load(server, 1, "/debug/trace"))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/gzip"
    assert response.headers["content-disposition"].endswith('.trace.json.gz"')
    trace = json.loads(gzip.decompress(response.content))
    spans = [event for event in trace["traceEvents"] if event.get("ph") == "X"]
    threads = {event["tid"]: event["args"]["name"] for event in trace["traceEvents"]
               if event.get("ph") == "M" and event.get("name") == "thread_name"}
    # The model's operators ran on the engine thread, which the trace names as Python does; in the workers layout
    # that thread lives in the engine process, where the worker relayed the request.
    linear = [event for event in spans if event["name"] in ("aten::linear", "aten::addmm")]
    assert linear, sorted({event["name"] for event in spans})[:40]
    assert {threads.get(event["tid"], "") for event in linear} & {"glassbox-engine-0", "glassbox-engine-1"}, threads
    assert any(event.get("args", {}).get("Input Dims") for event in linear)  # shapes are recorded


def test_the_trace_route_refuses_without_its_token_for_bad_seconds_and_while_one_runs(server: str) -> None:
    missing = httpx.post(server + "/debug/trace", params={"seconds": 1}, timeout=BOUND_S)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "unauthorized"
    for seconds in ("0.1", "11", "nan"):
        bad = httpx.post(server + "/debug/trace", params={"seconds": seconds}, timeout=BOUND_S,
                         headers={"Authorization": f"Bearer {TOKEN}"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_parameter", seconds

    assert asyncio.run(two_at_once(server, "/debug/trace")) == [200, 409]


def test_profiling_without_a_token_is_refused_at_start(tiny_model_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    process = serve(tiny_model_dir, free_port(), log, token=None)
    assert process.wait(BOUND_S) != 0
    assert "--profiling needs a bearer token for the profile API" in log.read_text()


def test_without_profiling_the_routes_are_not_there(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    process = serve(tiny_model_dir, port, tmp_path / "serve.log", "--no-profiling", "--workers", "2", token=None)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(process, url)
        for path in ("/debug/profile", "/debug/trace"):
            answer = httpx.post(url + path, params={"seconds": 1}, timeout=BOUND_S,
                                headers={"Authorization": f"Bearer {TOKEN}"})
            assert answer.status_code == 404, (path, answer.text)
    finally:
        process.terminate()
        process.wait(BOUND_S)

