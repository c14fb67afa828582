"""The multi-process layout's start-up failures are one plain line on stderr, like the one-process layout's."""

from __future__ import annotations

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
