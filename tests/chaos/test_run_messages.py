"""`glassbox chaos run`'s messages say what to change (a typo in an experiment's name lists the built-in ones, a
401 says whether the token was missing or wrong), --port for the local server, and progress as the run goes."""

from __future__ import annotations

import argparse
import asyncio
import io
from pathlib import Path
from typing import NoReturn

import pytest

from glassbox.chaos.cli import run as run_command
from glassbox.chaos.cli.run import builtin_experiments, progress_printer
from glassbox.chaos.client import ChaosClientError
from glassbox.chaos.local import LocalServer
from glassbox.chaos.phases import refusal
from glassbox.chaos.record import EXIT_USAGE, Timeline
from glassbox.service.cli import main


def test_a_typo_in_an_experiment_name_lists_the_built_in_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chaos", "run", "oom-fallbak"]) == 2
    err = capsys.readouterr().err
    names = builtin_experiments()
    assert "oom-fallback" in names
    assert err == (f"glassbox chaos run: no experiment file 'oom-fallbak' and no built-in experiment of that name; "
                   f"did you mean oom-fallback? the built-in ones are {', '.join(names)}\n")


@pytest.mark.parametrize(("token_given", "hint"), [
    (False, "no chaos token was given: pass --token-file or set GLASSBOX_CHAOS_TOKEN"),
    (True, "the chaos token was refused: pass the target's token with --token-file or GLASSBOX_CHAOS_TOKEN"),
])
def test_a_401_names_the_missing_or_wrong_token(token_given: bool, hint: str) -> None:
    error = ChaosClientError(401, "unauthorized", "this route needs the chaos token")
    stopped = refusal(error, "list faults", token_given)
    assert stopped.status == "aborted"
    assert stopped.reason == f"list faults: HTTP 401 unauthorized: this route needs the chaos token ({hint})"


def test_port_is_for_the_local_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chaos", "run", "oom-fallback", "--target", "http://127.0.0.1:9", "--port", "9100"]) == 2
    assert "--port configure the local server; with --target there is none" in capsys.readouterr().err
    assert main(["chaos", "run", "oom-fallback", "--port", "70000"]) == 2
    assert "--port must be 1..65535, got 70000" in capsys.readouterr().err


def test_the_local_server_listens_on_the_given_port(tmp_path: Path) -> None:
    local = LocalServer(None, (), tmp_path / "server.log", port=9123)
    assert local.url == "http://127.0.0.1:9123"
    assert local.argv[local.argv.index("--port") + 1] == "9123"


def test_progress_prints_each_event_as_it_happens() -> None:
    out = io.StringIO()
    timeline = Timeline(on_mark=progress_printer(out))
    timeline.mark("server_starting", "starting glassbox serve --chaos", mono=100.0)
    timeline.mark("phase", "baseline: 20 req/s (steady) for 20 s", mono=112.5)
    assert out.getvalue() == ("[    0.0s] starting glassbox serve --chaos\n"
                              "[   12.5s] baseline: 20 req/s (steady) for 20 s\n")
    assert [event.kind for event in timeline.events] == ["server_starting", "phase"]


@pytest.mark.parametrize(("flag", "value"), [
    ("--scrape-interval", "nan"), ("--scrape-interval", "0"), ("--duration-scale", "nan"),
    ("--duration-scale", "-1"), ("--rate-scale", "inf"),
])
def test_a_non_finite_or_non_positive_number_is_a_flag_error_before_anything_runs(
        flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # nan slips past `<= 0`: a nan scrape interval used to stop scraping in silence (the verdict failed, exit 1) and
    # a nan or inf scale crashed after the output directory was made
    out = tmp_path / "out"
    argv = ["chaos", "run", "oom-fallback", "--target", "http://127.0.0.1:9", "--out", str(out)]
    assert main([*argv, flag, value]) == 2
    assert capsys.readouterr().err == (f"glassbox chaos run: {flag} must be a positive finite number, "
                                       f"got {float(value)}\n")
    assert not out.exists()



def test_a_binary_token_file_or_experiment_file_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # read_text raises UnicodeDecodeError, a ValueError: it used to escape as a traceback (exit 1)
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00" + bytes(range(256)))
    target = ["--target", "http://127.0.0.1:9"]
    assert main(["chaos", "run", "oom-fallback", *target, "--token-file", str(binary)]) == 2
    assert capsys.readouterr().err == f"glassbox chaos run: --token-file: {binary} is not UTF-8 text\n"
    assert main(["chaos", "run", str(binary), *target]) == 2
    assert capsys.readouterr().err == (f"glassbox chaos run: cannot read {binary}: not UTF-8 text "
                                       f"(an experiment is a YAML file)\n")


def test_an_experiment_runs_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    # The runner's load generator is mostly event-loop work: on uvloop it spends less CPU a request and reads refusals
    # faster (docs/benchmarks/2026-12-04-chaos-runner-uvloop.md).
    pytest.importorskip("uvloop")
    loops: list[str] = []

    async def execute(args: object) -> NoReturn:
        loops.append(type(asyncio.get_running_loop()).__module__)
        raise run_command.UsageError("stop here")

    monkeypatch.setattr(run_command, "execute", execute)
    assert run_command.run(argparse.Namespace()) == EXIT_USAGE
    assert len(loops) == 1 and loops[0].startswith("uvloop")


@pytest.mark.parametrize(("flag", "variable", "file_flag"), [
    ("--token", "GLASSBOX_CHAOS_TOKEN", "--token-file"),
    ("--grafana-token", "GLASSBOX_GRAFANA_TOKEN", "--grafana-token-file"),
])
def test_a_token_as_a_flag_value_is_refused_naming_where_it_goes(
        flag: str, variable: str, file_flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["chaos", "run", "oom-fallback", "--target", "http://127.0.0.1:9", flag, "s3cret-token"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag} takes no value on the command line, where ps shows it" in err
    assert variable in err and file_flag in err and "s3cret" not in err

