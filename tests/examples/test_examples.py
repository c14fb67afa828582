"""Every file in examples/ runs against a live glassbox (the tiny test model under uvicorn) and succeeds, with the
output a user would see; a new example without a test here fails test_every_example_is_run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from glassbox.service.app import create_app
from tests.service.apptools import BOUND_S, LABELS, LiveServer, app_settings, live_server, wait_ready

EXAMPLES = Path(__file__).parents[2] / "examples"
RUN = {"curl.sh", "frames.sh", "classify_httpx.py", "kserve_tritonclient.py", "tei_huggingface_hub.py"}


@pytest.fixture(scope="module")
def live(tiny_model_dir: Path) -> Iterator[LiveServer]:
    settings = app_settings(tiny_model_dir)
    with live_server(create_app(settings), settings) as server:
        wait_ready(lambda path: httpx.get(server.base_url + path, timeout=BOUND_S))
        yield server


def run(live: LiveServer, name: str) -> str:
    path = EXAMPLES / name
    if name.endswith(".sh"):
        if shutil.which("curl") is None:
            pytest.skip("curl is not installed")
        command = ["sh", str(path), live.base_url]
    else:
        command = [sys.executable, str(path), live.base_url]
    done = subprocess.run(command, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, (done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))
    return done.stdout.decode()


def test_every_example_is_run() -> None:
    assert {path.name for path in EXAMPLES.iterdir() if path.suffix in (".sh", ".py")} == RUN


def test_curl(live: LiveServer, tiny_model_dir: Path) -> None:
    lines = run(live, "curl.sh").splitlines()
    classified = json.loads(lines[0])
    assert [len(r["scores"]) for r in classified["results"]] == [2, 2]
    headers = {line.split(":", 1)[0].lower() for line in lines[1:4]}
    assert headers == {"x-request-id", "x-latency-ms", "server-timing"}
    predicted = json.loads(lines[4])
    assert {entry["label"] for entry in predicted} == set(LABELS)
    assert {entry["label"] for entry in json.loads(lines[5])} == set(LABELS)  # one pair, one list
    assert json.loads(lines[6])["model_id"] == tiny_model_dir.name


def test_frames_with_data_binary(live: LiveServer) -> None:
    answer = json.loads(run(live, "frames.sh"))
    assert set(answer["results"]) == {"7", "42"}
    assert all(result["label"] in LABELS for result in answer["results"].values())


def test_httpx(live: LiveServer) -> None:
    out = run(live, "classify_httpx.py").splitlines()
    assert len(out) == 6
    assert out[2].startswith("server timing: ") and "infer;dur=" in out[2]
    assert out[3].startswith("user 7: ") and out[4].startswith("user 42: ")
    assert out[5].startswith("400 ") and "txt" in out[5]


def test_tritonclient(live: LiveServer, tiny_model_dir: Path) -> None:
    out = run(live, "kserve_tritonclient.py").splitlines()
    assert out[0] == f"model {tiny_model_dir.name} versions ['1'] outputs ['label', 'probabilities', 'logits']"
    assert out[1].startswith("labels [") and out[2].startswith("probabilities [[")
    assert out[3] == f"404: model {tiny_model_dir.name!r} has no version '2'; its one version is '1'"


def test_huggingface_hub(live: LiveServer) -> None:
    out = run(live, "tei_huggingface_hub.py").splitlines()
    assert len(out) == 2 and all(line.split()[0] in LABELS for line in out)
