"""`glassbox`: a command imports what it runs, when it runs; the server never loads the tools around it."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from glassbox.chaos.local import free_port
from glassbox.service.cli import COMMANDS, build_parser, main, named_command, probed_command
from tests.service.test_server import BOUND_S, wait_ready

ROOT = Path(__file__).resolve().parents[2]
# What `serve` must never load: the load generator and its HTTP client, the plots, the training code, the terminal UI.
NOT_FOR_SERVE = ("matplotlib", "glassbox.chaos.runner", "glassbox.chaos.loadgen", "glassbox.service.model.build",
                 "httpx", "rich")

# Runs the CLI in a fresh interpreter and, when it exits, writes the names of every module it had loaded.
MODULES_AT_EXIT = """
import atexit, json, sys
atexit.register(lambda: open(sys.argv[1], "w").write(json.dumps(sorted(sys.modules))))
from glassbox.service.cli import main
sys.exit(main(sys.argv[2:]))
"""


def run_cli(argv: list[str], modules_file: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    done = subprocess.run([sys.executable, "-c", MODULES_AT_EXIT, str(modules_file), *argv], capture_output=True,
                          text=True, cwd=ROOT, timeout=BOUND_S)
    return done, set(json.loads(modules_file.read_text()))


@pytest.mark.parametrize(("argv", "words"), [
    (["serve", "--port", "1"], ("serve",)),
    (["model", "build", "--if-missing"], ("model", "build")),
    (["bench", "engine", "--compare"], ("bench", "engine")),
    (["bench", "--rate", "3"], ("bench",)),
    (["bench", "--rate", "3", "engine"], ("bench",)),  # the option ends the words; the probe finds `engine`
    (["model"], ()),  # `model` alone runs nothing
    (["--help"], ()),
    (["nonsense"], ()),
])
def test_named_command_reads_the_leading_words(argv: list[str], words: tuple[str, ...]) -> None:
    assert named_command(argv) == words


def test_options_before_a_subcommand_name_still_run_the_subcommand() -> None:
    argv = ["bench", "--rate", "3", "engine", "--compare"]
    assert probed_command(argv, named_command(argv)) == ("bench", "engine")
    args = build_parser(("bench", "engine")).parse_args(argv)
    assert args.compare is True
    assert args._run.__module__ == "glassbox.service.bench.engine"


def test_a_line_that_does_not_parse_is_reported_by_the_real_parser(capsys: pytest.CaptureFixture[str]) -> None:
    assert probed_command(["serve", "--bogus"], ("serve",)) == ("serve",)  # the probe itself stays silent
    assert capsys.readouterr().err == ""


def test_only_the_named_command_is_loaded() -> None:
    parser = build_parser(("model", "info"))
    args = parser.parse_args(["model", "info"])
    assert args._run.__module__ == "glassbox.service.model.info"
    # every other command is listed with its help, but has no options and nothing to run until it is named
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--port", "1"])
    assert not hasattr(parser.parse_args(["serve"]), "_run")


def test_top_level_help_lists_every_command_and_imports_none(tmp_path: Path) -> None:
    done, modules = run_cli(["--help"], tmp_path / "modules.json")
    assert done.returncode == 0, done.stderr
    for words, _, _ in COMMANDS:
        assert words[0] in done.stdout
    loaded = {module for _, module, _ in COMMANDS} & modules
    assert not loaded, f"--help imported {loaded}"


def test_a_command_help_shows_its_options(tmp_path: Path) -> None:
    done, modules = run_cli(["bench", "engine", "--help"], tmp_path / "modules.json")
    assert done.returncode == 0, done.stderr
    assert "--quantize" in done.stdout
    assert "glassbox.service.server" not in modules


def serve_argv(model: Path, port: int, modules_file: Path) -> list[str]:
    return [sys.executable, "-c", MODULES_AT_EXIT, str(modules_file), "serve", "--model", str(model),
            "--device", "cpu", "--port", str(port), "--threads", "1", "--max-length", "32", "--length-buckets", "32",
            "--batch-buckets", "1", "--workers", "0", "--drain-timeout-s", "1"]


def serve_until_ready_then_stop(argv: list[str], port: int, log: Path, stderr: int | None = None,
                                sig: signal.Signals = signal.SIGTERM) -> None:
    """Runs `argv` (a server on `port`, stdout to `log`, stderr to `log` too unless given), waits until it is ready,
    sends it `sig` (SIGTERM unless given) and expects exit 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLASSBOX_")}
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT if stderr is None else stderr, env=env,
                                cwd=ROOT)
    try:
        wait_ready(proc, port, log)
        proc.send_signal(sig)
        assert proc.wait(BOUND_S) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_loads_only_the_server(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Start the server for real (one process: the HTTP side and the engine), let it become ready, stop it, and look
    at every module it had loaded. Its stderr is a file here, so its log lines are JSON (`--log-format auto`)."""
    port = free_port()
    log, modules_file = tmp_path / "serve.log", tmp_path / "modules.json"
    serve_until_ready_then_stop(serve_argv(tiny_model_dir, port, modules_file), port, log)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    ready = [line["message"] for line in lines if line["message"].startswith("listening on")]
    assert ready and f"http://127.0.0.1:{port}/v1/classify" in ready[0], lines
    modules = set(json.loads(modules_file.read_text()))
    assert "glassbox.service.app" in modules and "uvicorn" in modules  # it did serve
    loaded = {name for name in modules for banned in NOT_FOR_SERVE if name == banned or name.startswith(banned + ".")}
    assert not loaded, f"`glassbox serve` imported {sorted(loaded)}"


def test_serve_logs_readable_text_at_a_terminal(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The same server with its stderr on a pseudo-terminal, as after `make run`: text lines, not JSON."""
    port = free_port()
    log = tmp_path / "stdout.log"
    leader, follower = pty.openpty()
    try:
        serve_until_ready_then_stop(serve_argv(tiny_model_dir, port, tmp_path / "modules.json"), port, log,
                                    stderr=follower)
        os.close(follower)
        follower = -1
        text = read_all(leader)
    finally:
        if follower >= 0:
            os.close(follower)
        os.close(leader)
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines and not any(line.lstrip().startswith("{") for line in lines), text
    assert any(" INFO glassbox: listening on http://127.0.0.1:" in line for line in lines), text


def read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


# Ctrl-C during start-up: the command's imports (torch), model load and warm-up have no signal handling of their own.
@pytest.mark.parametrize("when", ["import", "run"])
def test_ctrl_c_during_start_up_is_one_line_and_exit_130(when: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(*_: object) -> int:
        raise KeyboardInterrupt

    if when == "import":
        monkeypatch.setattr("glassbox.service.cli.importlib.import_module", interrupted)
    else:
        monkeypatch.setattr("glassbox.service.bulk.cli.run", interrupted)
    try:
        code = main(["classify", str(tmp_path / "a.txt"), "--out", str(tmp_path / "out.jsonl")])
    except KeyboardInterrupt:  # uncaught, pytest would take it for the user's Ctrl-C and stop the whole run
        pytest.fail("KeyboardInterrupt escaped main: a traceback and death by SIGINT")
    assert code == 130
    assert capsys.readouterr().err == "glassbox classify: interrupted\n"


# Installs Python's own SIGINT handler (a test run in the background may have SIGINT ignored, and a child would
# inherit that), says so, then runs the CLI: the SIGINT sent on that line lands in main, importing torch.
# "started" is printed from inside main's Ctrl-C handling, where a command starts: printed before main was called,
# a SIGINT sent at once could land before main began (a loaded machine descheduled the child right after the
# print), and the test failed on its own harness.
INTERRUPTIBLE = """
import signal, sys
import glassbox.service.cli as cli
signal.signal(signal.SIGINT, signal.default_int_handler)
command = cli._main
def announced(argv, wanted):
    print("started", flush=True)
    return command(argv, wanted)
cli._main = announced
sys.exit(cli.main(sys.argv[1:]))
"""


def test_sigint_while_a_command_starts_exits_130_without_a_traceback(tiny_model_dir: Path, tmp_path: Path) -> None:
    texts = tmp_path / "a.txt"
    texts.write_text("good film\nbad film\n")
    argv = ["classify", str(texts), "--out", str(tmp_path / "out.jsonl"), "--model", str(tiny_model_dir)]
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTIBLE, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "started\n"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # it was a torch traceback and death by SIGINT (-2)
    assert (proc.returncode, err) == (130, "glassbox classify: interrupted\n")


def test_sigint_after_start_up_still_drains_serve_and_exits_0(tiny_model_dir: Path, tmp_path: Path) -> None:
    # serve's own handler (DrainingServer) takes SIGINT once it runs: the start-up catch must not change that
    port = free_port()
    log = tmp_path / "serve.log"
    serve_until_ready_then_stop(serve_argv(tiny_model_dir, port, tmp_path / "modules.json"), port, log,
                                sig=signal.SIGINT)
    assert "draining: not ready" in log.read_text() and "interrupted" not in log.read_text()
