"""The multi-process layout's start-up failures are one line on stderr, like the one-process layout's: the plain
`glassbox serve: cannot start: ...` where the log lines are text, one JSON log line where they are JSON."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from glassbox.service.serving.supervisor import Supervisor
from tests.service.apptools import app_settings


def test_a_port_in_use_is_one_plain_line(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert Supervisor(app_settings(tiny_model_dir, port=port, workers="2", log_format="text"), 2).run() == 1
    assert capsys.readouterr().err == f"glassbox serve: cannot start: 127.0.0.1:{port} is in use (--host, --port)\n"


def test_a_missing_model_is_one_plain_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert Supervisor(app_settings(tmp_path / "nothing", port=0, workers="2", log_format="text"), 2).run() == 1
    err = capsys.readouterr().err
    assert err.startswith("glassbox serve: cannot start: ") and err.endswith("(model_load_error)\n")
    assert err.count("\n") == 1 and "nothing" in err


@pytest.mark.parametrize(("overrides", "names"), [
    ({"api_key_file": "/nonexistent/key"}, "/nonexistent/key"),
    ({"chaos": True, "chaos_token_file": "/nonexistent/token"}, "/nonexistent/token"),
], ids=["api-key-file", "chaos-token-file"])
def test_a_setting_a_child_would_fail_on_is_one_plain_line_before_any_child(
        tiny_model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        overrides: dict[str, object], names: str) -> None:
    """Before, a bad key file made every worker fail and be replaced forever (the port bound, nobody answering),
    and a bad chaos token stopped the server only after the engine and workers had started."""
    started: list[str] = []
    monkeypatch.setattr(Supervisor, "_start_engine", lambda self: started.append("engine"))
    monkeypatch.setattr(Supervisor, "_start_worker", lambda self, *a, **k: started.append("worker"))
    monkeypatch.delenv("GLASSBOX_CHAOS_TOKEN", raising=False)
    assert Supervisor(app_settings(tiny_model_dir, port=0, workers="2", log_format="text", **overrides),
                      2).run() == 1
    err = capsys.readouterr().err
    assert err.startswith("glassbox serve: cannot start: ") and err.count("\n") == 1 and names in err, err
    assert started == []


def _exit_at_once() -> None:
    sys.exit(3)  # a worker that cannot live (not a settings failure, which stops the server at once)


def _wait_to_be_stopped() -> None:
    time.sleep(60)  # an engine process: the supervisor stops it with SIGTERM


def test_workers_that_keep_dying_stop_the_server(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that dies is replaced, but not forever: after WORKER_RESTART_BUDGET replacements within the window
    the server stops with exit code 1 (before, it replaced it every few seconds while clients waited on the port)."""
    from glassbox.service.serving import supervisor as module

    monkeypatch.setattr(module, "WORKER_RESTART_BUDGET", 3)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")  # run() sets it for its children: undone after the test
    starts: list[bool] = []

    def start_engine(self: Supervisor) -> object:
        process = self._context.Process(target=_wait_to_be_stopped)
        process.start()
        return module._Child(process, -1)

    def start_worker(self: Supervisor, index: int, replacement: bool = False) -> object:
        starts.append(replacement)
        process = self._context.Process(target=_exit_at_once)
        process.start()
        return module._Child(process, index, replacement)

    monkeypatch.setattr(Supervisor, "_start_engine", start_engine)
    monkeypatch.setattr(Supervisor, "_start_worker", start_worker)
    began = time.monotonic()
    assert Supervisor(app_settings(tiny_model_dir, port=0, workers="1"), 1).run() == 1
    assert starts == [False, True, True, True]  # the first, then the budget's three replacements
    assert time.monotonic() - began < 30  # and the engine was stopped, not waited for


def test_an_engine_past_its_restart_budget_stops_the_server_with_3_after_exit_when_dead_s(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--exit-when-dead-s: once the engine's restart budget is spent /livez says dead; that long after, the supervisor
    stops everything and exits 3, for a process manager that restarts on exit (Docker, systemd)."""
    from glassbox.service.serving import supervisor as module

    monkeypatch.setattr(module, "ENGINE_RESTART_BUDGET", 2)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")  # run() sets it for its children: undone after the test
    engines: list[float] = []

    def start_engine(self: Supervisor) -> object:
        engines.append(time.monotonic())
        process = self._context.Process(target=_exit_at_once)
        process.start()
        return module._Child(process, -1)

    def start_worker(self: Supervisor, index: int, replacement: bool = False) -> object:
        process = self._context.Process(target=_wait_to_be_stopped)
        process.start()
        return module._Child(process, index, replacement)

    monkeypatch.setattr(Supervisor, "_start_engine", start_engine)
    monkeypatch.setattr(Supervisor, "_start_worker", start_worker)
    supervisor = Supervisor(app_settings(tiny_model_dir, port=0, workers="1", exit_when_dead_s=1.0), 1)
    assert supervisor.run() == 3
    assert len(engines) == 3  # the first, then the budget's two restarts
    assert supervisor._live.value == 0  # /livez said dead first
    assert time.monotonic() - engines[-1] >= 1.0  # for the time set, then it stopped (and stopped the worker)


def test_the_runtime_folder_fits_a_socket_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a $TMPDIR too long for an AF_UNIX socket path the engine could not listen and crash-looped."""
    import shutil

    from glassbox.service.serving import supervisor as module

    base = tmp_path / ("long-" + "d" * 120)
    base.mkdir()
    monkeypatch.setattr(module.tempfile, "tempdir", str(base))
    folder = module.runtime_folder()
    try:
        assert str(folder).startswith("/tmp/glassbox-")
        assert len(str(folder / "engine.sock")) <= module.MAX_SOCKET_PATH
    finally:
        shutil.rmtree(folder)
    monkeypatch.setattr(module.tempfile, "tempdir", str(tmp_path))  # a short one is used as it is
    folder = module.runtime_folder()
    assert folder.parent == tmp_path


def test_weights_the_engine_cannot_load_end_with_one_plain_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor checks config.json and tokenizer.json without torch; the weights are read by the engine process.
    A checkpoint it cannot load stopped the server with exit 1 but left no plain line on stderr (the one-process
    layout prints one): the reason was one log line among the workers' shutdown lines."""
    from glassbox.service.model.checkpoint import WEIGHTS_FILE
    from tests.helpers import make_tiny_model_dir

    path = make_tiny_model_dir(tmp_path / "model")
    (path / WEIGHTS_FILE).write_bytes(b"")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")  # run() sets it for its children: undone after the test
    assert Supervisor(app_settings(path, port=0, workers="1", log_format="text"), 1).run() == 1
    err = capsys.readouterr().err
    plain = [line for line in err.splitlines() if line.startswith("glassbox serve:")]
    assert plain == [f"glassbox serve: cannot start: {path / WEIGHTS_FILE} is not a readable safetensors file: "
                     "Error while deserializing header: header too small (model_load_error)"], err


@pytest.mark.parametrize("workers", ["0", "1"], ids=["one-process", "workers"])
@pytest.mark.parametrize("broken", ["model", "weights"])
def test_where_the_log_is_json_the_one_line_is_a_json_log_line(tmp_path: Path, workers: str, broken: str) -> None:
    """stderr not a terminal (a container, CI, a pipe): one JSON line says it, and no plain line follows it; the
    engine process that could not read the weights leaves the saying to the supervisor."""
    import json
    import os
    import subprocess

    from glassbox.service.model.checkpoint import WEIGHTS_FILE
    from tests.helpers import make_tiny_model_dir

    model = tmp_path / "nothing"
    if broken == "weights":
        model = make_tiny_model_dir(tmp_path / "model")
        (model / WEIGHTS_FILE).write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLASSBOX_")}
    done = subprocess.run([sys.executable, "-m", "glassbox.service", "serve", "--model", str(model), "--device", "cpu",
                           "--port", "0", "--workers", workers, "--max-length", "32", "--length-buckets", "32",
                           "--batch-buckets", "1"], capture_output=True, text=True, env=env, timeout=120,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 1, done.stderr
    said = [line for line in done.stderr.splitlines() if "cannot start" in line]
    assert len(said) == 1, done.stderr
    record = json.loads(said[0])
    assert record["level"] == "error" and record["message"].startswith("cannot start: ")
    assert record["message"].endswith("(model_load_error)")
    assert not any(line.startswith("glassbox serve:") for line in done.stderr.splitlines()), done.stderr

