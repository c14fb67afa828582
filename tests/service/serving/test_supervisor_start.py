"""The multi-process layout's start-up failures are one plain line on stderr, like the one-process layout's."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from service.serving.supervisor import Supervisor
from tests.service.apptools import app_settings


def test_a_port_in_use_is_one_plain_line(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert Supervisor(app_settings(tiny_model_dir, port=port, workers="2"), 2).run() == 1
    assert capsys.readouterr().err == f"glassbox serve: cannot start: 127.0.0.1:{port} is in use (--host, --port)\n"


def test_a_missing_model_is_one_plain_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert Supervisor(app_settings(tmp_path / "nothing", port=0, workers="2"), 2).run() == 1
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
    assert Supervisor(app_settings(tiny_model_dir, port=0, workers="2", **overrides), 2).run() == 1
    err = capsys.readouterr().err
    assert err.startswith("glassbox serve: cannot start: ") and err.count("\n") == 1 and names in err, err
    assert started == []


def test_workers_that_keep_dying_stop_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that cannot live is replaced WORKER_RESTART_BUDGET times, then the server stops with exit code 1."""
    from service.serving import supervisor as module

    times = module.deque()  # type: ignore[var-annotated]
    allowed = [module._within_budget(times, module.WORKER_RESTART_BUDGET, module.WORKER_RESTART_WINDOW_S)
               for _ in range(module.WORKER_RESTART_BUDGET + 1)]
    assert allowed == [True] * module.WORKER_RESTART_BUDGET + [False]
    monkeypatch.setattr(module.time, "monotonic", lambda: 1e9)  # the window has passed: room again
    assert module._within_budget(times, module.WORKER_RESTART_BUDGET, module.WORKER_RESTART_WINDOW_S)


def test_the_runtime_folder_fits_a_socket_path_and_sweeps_killed_supervisors_leftovers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    import subprocess
    import sys

    from service.serving import supervisor as module

    base = tmp_path / ("long-" + "d" * 120)  # a $TMPDIR under which engine.sock would not fit AF_UNIX's limit
    base.mkdir()
    monkeypatch.setattr(module.tempfile, "tempdir", str(base))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()  # a pid that no longer runs
    leftovers = {name: base / f"glassbox-{name}" for name in ("killed", "running", "foreign")}
    for leftover in leftovers.values():
        leftover.mkdir()
    (leftovers["killed"] / module.OWNER_FILE).write_text(dead)
    (leftovers["running"] / module.OWNER_FILE).write_text(str(os.getppid()))  # a live process: left alone
    folder = module.runtime_folder()
    try:
        assert str(folder).startswith("/tmp/glassbox-")
        assert len(str(folder / "engine.sock")) <= module.MAX_SOCKET_PATH
        assert (folder / module.OWNER_FILE).read_text() == str(os.getpid())
        assert not leftovers["killed"].exists()
        assert leftovers["running"].exists() and leftovers["foreign"].exists()  # no owner file: not ours to judge
    finally:
        shutil.rmtree(folder)
