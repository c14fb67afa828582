"""The command line's mistakes are reported by the command that was meant, with its own usage."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from glassbox.service.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("argv", "usage"), [
    (["serve", "--max-batchsize", "8"], "usage: glassbox serve "),
    (["bench", "engine", "--repeats", "2"], "usage: glassbox bench engine "),
    (["model", "inspect", "dir", "--jsn"], "usage: glassbox model inspect "),
])
def test_a_mistyped_flag_prints_the_subcommands_usage(argv: list[str], usage: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert f"error: unrecognized arguments: {' '.join(argv[-2:] if argv[-1].isdigit() else argv[-1:])}" in err


def test_output_cut_short_by_its_reader_ends_quietly(tiny_model_dir: Path) -> None:
    """`glassbox model inspect DIR --json | head -1`: the reader leaves before glassbox writes, which is a
    BrokenPipeError in Python; the command ends with SIGPIPE's status and no traceback."""
    process = subprocess.Popen([sys.executable, "-m", "glassbox.service", "model", "inspect", str(tiny_model_dir),
                                "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # gone before the first write
    errors = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141
    assert "Traceback" not in errors and "BrokenPipe" not in errors, errors


def test_a_broken_pipe_that_is_not_stdout_is_still_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """`glassbox bench` against a server that resets its connections: that BrokenPipeError is the command's failure,
    not a reader of its output going away, and is not hidden."""
    import argparse

    def broken_socket(_args: argparse.Namespace) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args",
                        lambda self, argv=None: (argparse.Namespace(_run=broken_socket), []))
    with pytest.raises(BrokenPipeError):
        main(["bench"])
