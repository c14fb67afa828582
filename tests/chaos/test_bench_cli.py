"""`glassbox bench --target ...` (glassbox.chaos.cli.bench) through the real command line, and `glassbox bench engine`
still reachable beside it."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from glassbox.service.cli import main
from tests.chaos.test_loadgen import served, served_ok


def test_json_output_has_the_spectrum_rates_and_errors(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("good film\nbad movie\n\nfun music\n", encoding="utf-8")
    with served(tiny_model_dir) as (live, _engine, observer):
        code = main(["bench", "--target", live.base_url + "/", "--rate", "20", "--duration", "0.5", "--json",
                     "--connections", "2", "--protocol", "frames", "--texts", str(texts), "--no-progress"])
        served_now = served_ok(observer)
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert {"config", "duration_s", "offered_rate", "achieved_rate", "ok_rate", "counts", "errors", "latency_ms",
            "spectrum", "scheduler_lag_ms", "generator_cpu_s", "generator_cpu_ms_per_request"} <= set(out)
    assert out["generator_cpu_s"] > 0 and out["scheduler_lag_ms"]["max"] >= out["scheduler_lag_ms"]["p50"] > 0
    assert out["counts"]["ok"] == out["counts"]["planned"] == 10 == served_now
    assert out["errors"] == {"http_429": 0, "http_4xx": 0, "http_5xx": 0, "timeout": 0, "connect": 0,
                             "transport": 0, "backlog": 0}
    assert {"p50", "p90", "p95", "p99", "p99.9", "p99.99", "max", "mean"} <= set(out["latency_ms"])
    assert out["spectrum"][-1] == {"percentile": 100.0, "latency_ms": out["latency_ms"]["max"], "count": 10}
    assert out["config"]["protocol"] == "frames" and out["config"]["texts"] == "3 given texts"
    assert out["config"]["target"] == live.base_url
    assert out["offered_rate"] == pytest.approx(20)


def test_the_table_names_rates_and_percentiles(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with served(tiny_model_dir) as (live, _engine, _observer):
        code = main(["bench", "--target", live.base_url, "--rate", "10", "--duration", "0.3", "--profile", "step",
                     "--connections", "1", "--no-progress"])
    assert code == 0
    text = capsys.readouterr().out
    assert "achieved" in text and "latency p99" in text and "offered" in text


def test_errors_are_reported_by_kind_and_no_success_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections to it are refused
        target = f"http://127.0.0.1:{closed.getsockname()[1]}"
        assert main(["bench", "--target", target, "--rate", "10", "--duration", "0.3", "--json", "--no-progress"]) == 1
    captured = capsys.readouterr()
    out = json.loads(captured.out)  # the report still comes out: the run did not do its job, but says why
    assert out["errors"]["connect"] == 3 and out["counts"]["ok"] == 0 and out["latency_ms"] == {}
    assert captured.err.strip() == (f"glassbox bench: no request succeeded (3 connect); is a glassbox server "
                                    f"listening at {target}?")


@pytest.mark.parametrize(("argv", "message"), [
    ([], "--target, --rate and --duration are required"),
    (["--target", "http://127.0.0.1:9", "--rate", "0", "--duration", "1"], "--rate must be above 0"),
    (["--target", "http://127.0.0.1:9", "--rate", "-5", "--duration", "1"], "--rate must be above 0"),
    (["--target", "http://127.0.0.1:9", "--rate", "nan", "--duration", "1"], "--rate must be above 0"),
    (["--target", "http://127.0.0.1:9", "--rate", "5", "--duration", "3601"], "--duration must be above 0"),
    (["--target", "ftp://127.0.0.1:9", "--rate", "5", "--duration", "1"], "http:// or https://"),
    (["--target", "127.0.0.1:9", "--rate", "5", "--duration", "1"], "http:// or https://"),
    (["--target", "http://127.0.0.1:9", "--rate", "5", "--duration", "1", "--connections", "0"], "--connections"),
    (["--target", "http://127.0.0.1:9", "--rate", "5", "--duration", "1", "--timeout", "0"], "--timeout"),
    (["--target", "http://127.0.0.1:9", "--rate", "5", "--duration", "1", "--texts", "/nonexistent/x"], "--texts"),
])
def test_bad_arguments_exit_2_with_a_clear_message(argv: list[str], message: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def test_argparse_errors_exit_2() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--target", "http://127.0.0.1:9", "--rate", "5", "--duration", "1", "--profile", "ramp"])
    assert exc.value.code == 2


def test_bench_engine_is_still_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "engine", "--help"])
    assert exc.value.code == 0
    assert "--compare" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "--target" in text and "engine" in text


def test_other_groups_still_need_a_subcommand() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["model"])
    assert exc.value.code == 2
