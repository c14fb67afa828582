"""`glassbox classify` end to end on a tiny random model: formats, order, bad lines, resume, bounded windows."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from glassbox.service.bulk import command
from glassbox.service.bulk.classifier import Classifier
from glassbox.service.cli import main
from glassbox.service.wire.frames import encode_frames
from tests.helpers import WORDS

ROOT = Path(__file__).resolve().parents[3]


def texts(count: int, seed: int = 0) -> list[str]:
    """Texts of 1 to 40 words, so that sorting by length reorders them."""
    rng = np.random.default_rng(seed)
    return [" ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), size=int(n)))
            for n in rng.integers(1, 40, size=count)]


def classify(tiny_model_dir: Path, *args: str) -> int:
    return main(["classify", *args, "--model", str(tiny_model_dir), "--device", "cpu", "--no-progress"])


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> Classifier:
    return Classifier(tiny_model_dir, engine_threads=1, all_scores=True)


def test_text_file_in_input_order_matching_one_text_at_a_time(tiny_model_dir: Path, tmp_path: Path,
                                                              reference: Classifier) -> None:
    lines = texts(300)
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert classify(tiny_model_dir, str(source), "--out", str(out), "--window", "64", "--batch-tokens", "256") == 0
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == list(range(1, 301))
    for row, text in zip(rows[::37], lines[::37], strict=True):  # each alone, unbatched
        (alone,) = reference.predict([text])
        assert row["label"] == alone["label"]
        assert row["score"] == pytest.approx(alone["score"], abs=1e-5)
    assert not (tmp_path / "out.jsonl.partial").exists() and not (tmp_path / "out.jsonl.progress").exists()


def test_json_lines_with_ids_pairs_and_all_scores(tiny_model_dir: Path, tmp_path: Path,
                                                  reference: Classifier) -> None:
    source = tmp_path / "in.jsonl"
    records = [{"id": f"r{i}", "text": t, **({"text_pair": "the plot"} if i % 2 else {})}
               for i, t in enumerate(texts(20))]
    source.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert classify(tiny_model_dir, str(source), "--out", str(out), "--all-scores") == 0
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == [r["id"] for r in records]
    assert set(rows[0]["scores"]) == set(reference.labels)
    pairs = reference.predict([records[1]["text"]], ["the plot"])[0]
    assert rows[1]["scores"] == pytest.approx(pairs["scores"], abs=1e-5)
    assert rows[1]["label"] == pairs["label"]


def test_csv_in_csv_out_with_named_columns(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.csv"
    source.write_text('key,review\n10,"good, very good"\n11,"awful\nmovie"\n', encoding="utf-8")
    out = tmp_path / "out.csv"
    assert classify(tiny_model_dir, str(source), "--out", str(out), "--text-column", "review",
                    "--id-column", "key", "--all-scores") == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "id,label,score,truncated,score_negative,score_positive,score_neutral"
    assert [line.split(",")[0] for line in lines[1:]] == ["10", "11"]


def test_tsv_out_is_tab_separated(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A .tsv input is read with tabs, and --out x.tsv chose CSV output, but it was written with commas."""
    source = tmp_path / "in.tsv"
    source.write_text("id\ttext\nr-1\tgood, very good\nr-2\tawful movie\n", encoding="utf-8")
    out = tmp_path / "out.tsv"
    assert classify(tiny_model_dir, str(source), "--out", str(out)) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "id\tlabel\tscore\ttruncated"
    assert [line.split("\t")[0] for line in lines[1:]] == ["r-1", "r-2"] and "," not in "".join(lines)


def test_frames_file_and_stdin(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    body = encode_frames(texts(5), [50, 40, 30, 20, 10])
    source = tmp_path / "in.frames"
    source.write_bytes(body)
    out = tmp_path / "out.jsonl"
    assert classify(tiny_model_dir, str(source), "--out", str(out)) == 0
    assert [r["id"] for r in read_jsonl(out)] == [50, 40, 30, 20, 10]

    class Stdin:
        buffer = __import__("io").BytesIO(body)

    monkeypatch.setattr(sys, "stdin", Stdin)
    capsysbinary.readouterr()
    assert classify(tiny_model_dir, "-", "--format", "frames") == 0
    printed = [json.loads(line) for line in capsysbinary.readouterr().out.splitlines()]
    assert [r["id"] for r in printed] == [50, 40, 30, 20, 10]
    assert [r["label"] for r in printed] == [r["label"] for r in read_jsonl(out)]


def bad_input(tmp_path: Path) -> Path:
    source = tmp_path / "in.jsonl"
    long = " ".join(["movie"] * 200)  # past the tiny model's 128 positions
    source.write_bytes(b"\n".join([
        b'{"text": "good"}', b"{broken", b'{"text": "fine"}', b'{"text": "bad \xff byte"}',
        b'{"other": 1}', json.dumps({"text": long}).encode(), b'{"text": "last"}',
    ]) + b"\n")
    return source


def test_bad_lines_skipped_into_the_errors_file(tiny_model_dir: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    code = classify(tiny_model_dir, str(bad_input(tmp_path)), "--out", str(out), "--errors", str(errors),
                    "--on-error", "skip", "--oversize", "reject", "--window", "3")
    assert code == 0
    assert [r["id"] for r in read_jsonl(out)] == [1, 3, 7]
    assert [(e["line"], e["code"]) for e in read_jsonl(errors)] == [
        (2, "invalid_json"), (4, "invalid_utf8"), (5, "missing_field"), (6, "text_too_long")]
    err = capsys.readouterr().err
    assert ":2: invalid_json" in err and "4 errors" in err and "Traceback" not in err


def test_an_empty_text_is_refused_as_the_routes_refuse_it(tiny_model_dir: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """An empty text has nothing to classify: empty_input, as POST /v1/classify answers it (422). A text file's empty
    lines are not texts at all and are passed over, as JSON lines' blank lines are."""
    source, out, errors = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    source.write_text('{"text": "good"}\n{"text": ""}\n{"text": " "}\n', encoding="utf-8")
    assert classify(tiny_model_dir, str(source), "--out", str(out), "--errors", str(errors), "--on-error",
                    "skip") == 0
    assert [r["id"] for r in read_jsonl(out)] == [1, 3]
    assert [(e["line"], e["code"]) for e in read_jsonl(errors)] == [(2, "empty_input")]
    assert classify(tiny_model_dir, str(source), "--out", str(tmp_path / "stop.jsonl")) == 1  # --on-error stop
    assert ":2: empty_input" in capsys.readouterr().err
    text = tmp_path / "in.txt"
    text.write_text("good\n\nbad\n", encoding="utf-8")
    assert classify(tiny_model_dir, str(text), "--out", str(tmp_path / "text.jsonl")) == 0
    assert [r["id"] for r in read_jsonl(tmp_path / "text.jsonl")] == [1, 3]


def test_stdout_closed_by_its_reader_ends_quietly_with_sigpipe_status(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`glassbox classify FILE | head -1`: the reader is gone before the first row is written."""
    source = tmp_path / "in.txt"
    source.write_text("good film\nbad film\n", encoding="utf-8")
    run = subprocess.Popen([sys.executable, "-m", "glassbox.service.cli", "classify", str(source), "--model",
                            str(tiny_model_dir), "--device", "cpu", "--no-progress"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.stdout is not None and run.stderr is not None
    run.stdout.close()  # the reader stops before anything was written
    err = run.stderr.read().decode()
    assert run.wait(timeout=120) == 128 + signal.SIGPIPE, err
    assert err == ""


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_stdout_closed_by_its_reader_mid_write_ends_quietly_with_sigpipe_status(
        tiny_model_dir: Path, tmp_path: Path, unbuffered: str) -> None:
    """`glassbox classify FILE | head -1` where the reader goes while a window's rows are being written: one window
    of rows larger than the pipe's buffer, a reader that takes a few bytes and leaves. Under PYTHONUNBUFFERED stdout
    is a raw FileIO whose write(2) then comes up short without raising: the rest was lost and the run claimed
    success with exit 0."""
    source = tmp_path / "in.txt"
    source.write_text("".join(f"review number {i} was fine and funny\n" for i in range(3000)), encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    run = subprocess.Popen([sys.executable, "-m", "glassbox.service.cli", "classify", str(source), "--model",
                            str(tiny_model_dir), "--device", "cpu", "--no-progress", "--threads", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                           env={**env, "PYTHONPATH": str(ROOT)})
    assert run.stdout is not None and run.stderr is not None
    assert os.read(run.stdout.fileno(), 16)  # blocks until the rows (~200 KB, one write) start coming
    run.stdout.close()  # the reader leaves with the pipe full and most of the write still to go
    err = run.stderr.read().decode()
    assert run.wait(timeout=120) == 128 + signal.SIGPIPE, err
    assert err == ""  # no "3000 texts, ..." claim of success


def test_bad_line_stops_the_run_and_resume_goes_on_once_fixed(tiny_model_dir: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "good"}\n{"text": "fine"}\n{broken\n{"text": "last"}\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert classify(tiny_model_dir, str(source), "--out", str(out), "--window", "100") == 1
    err = capsys.readouterr().err
    assert f"{source}:3: invalid_json" in err and "--resume" in err and "Traceback" not in err
    assert not out.exists()
    assert [r["id"] for r in read_jsonl(tmp_path / "out.jsonl.partial")] == [1, 2]
    # Without --resume the partial run is not overwritten by accident.
    assert classify(tiny_model_dir, str(source), "--out", str(out)) == 1
    assert "--resume" in capsys.readouterr().err
    source.write_text('{"text": "good"}\n{"text": "fine"}\n{"text": "fixed"}\n{"text": "last"}\n', encoding="utf-8")
    assert classify(tiny_model_dir, str(source), "--out", str(out), "--resume") == 0
    assert [r["id"] for r in read_jsonl(out)] == [1, 2, 3, 4]


def test_unreadable_input_and_missing_column_exit_1_without_traceback(tiny_model_dir: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert classify(tiny_model_dir, str(tmp_path / "nope.jsonl")) == 1
    source = tmp_path / "in.csv"
    source.write_text("body\nx\n", encoding="utf-8")
    assert classify(tiny_model_dir, str(source), "--out", str(tmp_path / "o.jsonl")) == 1
    assert main(["classify", str(source), "--text-column", "body", "--model", str(tmp_path / "no-model")]) == 1
    err = capsys.readouterr().err
    assert "does not exist" in err and "no column 'text'" in err and "model directory" in err
    assert "Traceback" not in err
    assert not (tmp_path / "o.jsonl").exists() and not (tmp_path / "o.jsonl.partial").exists()


def test_metrics_port_out_of_range_or_taken_exits_1_before_the_model_loads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.txt"
    source.write_text("good film\n", encoding="utf-8")
    no_model = str(tmp_path / "no-model")  # reached only if the port is accepted
    for port in ("70000", "-1"):
        assert main(["classify", str(source), "--model", no_model, "--metrics-port", port]) == 1
        assert f"--metrics-port must be 0..65535 (got {port})" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert main(["classify", str(source), "--model", no_model, "--metrics-port", port]) == 1
    err = capsys.readouterr().err
    assert f"cannot serve metrics on --metrics-port {port}: Address already in use" in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_unusable_output_paths_are_refused_before_the_model_loads(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Each used to fail only after the whole run, with a traceback, and some left partial files no run could
    resume; now each is one line and exit 1 before anything is loaded or written."""
    source = bad_input(tmp_path)
    a_file = tmp_path / "a-file"
    a_file.write_text("", encoding="utf-8")
    out = str(tmp_path / "out.jsonl")
    cases = {
        ("--out", str(tmp_path)): "is a directory",
        ("--out", out, "--errors", str(tmp_path)): "is a directory",
        ("--out", out, "--errors", out, "--on-error", "skip"): "is also --out",
        ("--out", out, "--summary", str(tmp_path)): "is a directory",
        ("--out", str(a_file / "out.jsonl")): "is not a directory",
        # The input itself: the rename at the end put the results in its place, and the input was gone.
        ("--out", str(source)): "is also the input",
        ("--out", out, "--errors", str(source), "--on-error", "skip"): "is also the input",
        ("--out", out, "--summary", str(tmp_path / "." / source.name)): "is also the input",
    }
    before = sorted(tmp_path.iterdir())
    for flags, message in cases.items():
        # The model directory does not exist: a refusal that names it would mean the paths were checked too late.
        assert main(["classify", str(source), *flags, "--model", str(tmp_path / "no-model")]) == 1, flags
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, (flags, err)
    assert sorted(tmp_path.iterdir()) == before


def test_out_and_errors_naming_a_pipe_or_device_are_written_in_place(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`--out /dev/null` (or a named pipe) was written as /dev/null.partial and renamed over /dev/null at the end:
    run as root, as in a container, the device was replaced by a regular file holding the results."""
    source = bad_input(tmp_path)
    out, errors = tmp_path / "out.pipe", tmp_path / "errors.pipe"
    got: dict[Path, bytes] = {}
    readers = []
    for pipe in (out, errors):
        os.mkfifo(pipe)
        readers.append(threading.Thread(target=lambda p=pipe: got.__setitem__(p, p.read_bytes()), daemon=True))
        readers[-1].start()
    assert classify(tiny_model_dir, str(source), "--out", str(out), "--errors", str(errors), "--on-error", "skip",
                    "--oversize", "reject") == 0
    for reader in readers:
        reader.join(timeout=30)
    assert [json.loads(line)["id"] for line in got[out].splitlines()] == [1, 3, 7]
    assert len(got[errors].splitlines()) == 4
    assert stat.S_ISFIFO(out.stat().st_mode) and stat.S_ISFIFO(errors.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["errors.pipe", "in.jsonl", "out.pipe"]


def test_a_summary_that_cannot_be_written_is_one_line_and_exit_1(tiny_model_dir: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.txt"
    source.write_text("good film\n", encoding="utf-8")
    summary = tmp_path / "summary.json"

    def refuse(self: Path, *args: Any, **kwargs: Any) -> int:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "write_text", refuse)
    assert classify(tiny_model_dir, str(source), "--out", str(tmp_path / "o.jsonl"), "--summary", str(summary)) == 1
    err = capsys.readouterr().err
    assert f"cannot write the summary to {summary}: Permission denied" in err and "Traceback" not in err
    assert len(read_jsonl(tmp_path / "o.jsonl")) == 1  # the results are in place


def test_memory_holds_one_window_of_an_input_larger_than_it(tiny_model_dir: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Each engine call sees at most a window, and a window is written before the next one is read."""
    source = tmp_path / "in.txt"
    source.write_text("\n".join(texts(1000, seed=1)) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    seen: list[tuple[int, int]] = []  # (texts in the call, rows already on disk when it was made)
    partial = tmp_path / "out.jsonl.partial"
    real = Classifier.run

    def spy(self: Classifier, tokens: Any, **kwargs: Any) -> Any:
        seen.append((tokens.size, len(partial.read_bytes().splitlines())))
        return real(self, tokens, **kwargs)

    monkeypatch.setattr(Classifier, "run", spy)
    assert classify(tiny_model_dir, str(source), "--out", str(out), "--window", "64") == 0
    assert len(read_jsonl(out)) == 1000
    assert max(size for size, _ in seen) == 64 and len(seen) == 16
    assert [written for _, written in seen] == [64 * i for i in range(16)]


def test_windows_read_no_further_than_one_window() -> None:
    consumed = 0

    def source() -> Any:
        nonlocal consumed
        from glassbox.service.bulk.records import Item

        for i in range(10_000):
            consumed += 1
            yield Item(i, i + 1, i + 1, "x")

    windows = command.windows(source(), 100, skip=250)
    first = next(windows)
    assert [r.position for r in first] == list(range(250, 350))
    assert consumed == 350


def test_resume_over_an_input_shorter_than_the_checkpoint_is_refused(tiny_model_dir: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The input was replaced by a shorter one (a new export under the old name, lines cut while fixing the bad one):
    --resume skipped all of it, wrote nothing, put the old rows in place and exited 0."""
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(f'{{"text": "{t}"}}\n' for t in texts(6)) + "{broken\n", encoding="utf-8")
    assert classify(tiny_model_dir, str(source), "--out", str(out)) == 1
    source.write_text('{"text": "good"}\n{"text": "bad"}\n', encoding="utf-8")
    capsys.readouterr()
    assert classify(tiny_model_dir, str(source), "--out", str(out), "--resume") == 1
    err = capsys.readouterr().err
    assert "the input holds 2 inputs, but the checkpoint counts 6 done" in err and "Traceback" not in err
    assert not out.exists()
    from glassbox.service.bulk.records import Item

    done = [Item(i, i + 1, i + 1, "x") for i in range(6)]
    assert list(command.windows(iter(done), 4, skip=6)) == []  # every input done: nothing left, not an error


def test_resume_after_a_kill_mid_run_loses_and_repeats_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The run reads stdin; the test feeds it four windows, waits for their checkpoint, kills it with SIGKILL, adds
    half a row to the partial output (a kill mid-write), and resumes on the whole input."""
    lines = texts(500, seed=2)
    data = ("\n".join(lines) + "\n").encode()
    out = tmp_path / "out.jsonl"
    args = [sys.executable, "-m", "glassbox.service.cli", "classify", "-", "--format", "text", "--model",
            str(tiny_model_dir), "--device", "cpu", "--window", "50", "--engine-threads", "1", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([*args, "--out", str(out)], stdin=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                             env=env)
    assert first.stdin is not None
    first.stdin.write(("\n".join(lines[:230]) + "\n").encode())
    first.stdin.flush()
    progress = tmp_path / "out.jsonl.progress"
    deadline = time.monotonic() + 120
    while not (progress.exists() and '"done": 200' in progress.read_text()):
        assert first.poll() is None, first.stderr.read() if first.stderr else ""
        assert time.monotonic() < deadline, "no checkpoint at 200 inputs"
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait()
    partial = tmp_path / "out.jsonl.partial"
    assert len(partial.read_bytes().splitlines()) == 200
    with partial.open("ab") as handle:
        handle.write(b'{"id":201,"lab')
    resumed = subprocess.run([*args, "--out", str(out), "--resume"], input=data, capture_output=True, cwd=ROOT,
                             env=env, timeout=120)
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert "resuming after 200 inputs" in resumed.stderr.decode()
    clean = tmp_path / "clean.jsonl"
    whole = subprocess.run([*args, "--out", str(clean)], input=data, capture_output=True, cwd=ROOT, env=env,
                           timeout=120)
    assert whole.returncode == 0, whole.stderr.decode()
    rows, expected = read_jsonl(out), read_jsonl(clean)
    assert [r["id"] for r in rows] == list(range(1, 501))
    assert rows == expected


def test_resume_of_a_finished_run_does_nothing(tiny_model_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.txt"
    source.write_text("good\nbad\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert classify(tiny_model_dir, str(source), "--out", str(out)) == 0
    before = out.read_bytes()
    assert classify(tiny_model_dir, str(source), "--out", str(out), "--resume") == 0
    assert out.read_bytes() == before and "nothing to do" in capsys.readouterr().err


def test_resume_refuses_a_checkpoint_of_another_input(tiny_model_dir: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    stopped, other = tmp_path / "a.jsonl", tmp_path / "b.txt"
    stopped.write_text('{"text": "good"}\n{broken\n', encoding="utf-8")
    other.write_text("good\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert classify(tiny_model_dir, str(stopped), "--out", str(out)) == 1
    assert classify(tiny_model_dir, str(other), "--out", str(out), "--resume") == 1
    assert "belongs to a run with other inputs" in capsys.readouterr().err
    assert (tmp_path / "out.jsonl.partial").read_text(encoding="utf-8").count("\n") == 1  # untouched


def test_resume_refuses_a_checkpoint_of_another_model_or_max_length(tiny_model_dir: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The checkpoint named the input and the output options but not what scores the rows: resumed with another
    --model or --max-length, a run wrote the rows after its checkpoint from another model (or truncation) than
    those before it into one file, without a word."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "good"}\n{broken\n{"text": "the worst plot of the year"}\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert classify(tiny_model_dir, str(source), "--out", str(out)) == 1
    source.write_text('{"text": "good"}\n{"text": "fixed"}\n{"text": "the worst plot of the year"}\n',
                      encoding="utf-8")
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other)
    for flags in (["--max-length", "4"], ["--model", str(other)]):
        assert main(["classify", str(source), "--out", str(out), "--resume", "--device", "cpu", "--no-progress",
                     "--model", str(tiny_model_dir), *flags]) == 1, flags
        assert "belongs to a run with other inputs or options" in capsys.readouterr().err
    assert classify(tiny_model_dir, str(source), "--out", str(out), "--resume") == 0
    assert [r["truncated"] for r in read_jsonl(out)] == [False, False, False]


def test_summary_counts_texts_tokens_errors_and_padding(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "good movie"}\n{nope\n{"text": "the worst plot"}\n', encoding="utf-8")
    summary = tmp_path / "summary.json"
    assert classify(tiny_model_dir, str(source), "--out", str(tmp_path / "o.jsonl"), "--on-error", "skip",
                    "--summary", str(summary)) == 0
    got = json.loads(summary.read_text())
    assert (got["texts"], got["errors"], got["error_codes"]) == (2, 1, {"invalid_json": 1})
    assert got["tokens"] == 4 + 5  # [CLS] good movie [SEP], [CLS] the worst plot [SEP]
    assert 0.0 <= got["padding_ratio"] < 1.0 and got["seq_per_s"] > 0


def test_a_full_disk_mid_run_is_one_line_and_exit_1_not_a_traceback(tiny_model_dir: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The flush of a window failed with ENOSPC, and closing the files for --resume flushed the same bytes again and
    raised out of the error handler: a traceback. /dev/full fails every write with ENOSPC, as a full disk does."""
    source = tmp_path / "in.txt"
    source.write_text("good\nbad\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    (tmp_path / "out.jsonl.partial").symlink_to("/dev/full")
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # /dev/full cannot be fsynced at all; a full disk can
    assert classify(tiny_model_dir, str(source), "--out", str(out)) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "--resume goes on from it" in err and "Traceback" not in err
    assert (tmp_path / "out.jsonl.progress").exists()


def test_a_truncated_frame_under_skip_is_not_left_in_the_errors_file_once_resume_reads_it(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """--on-error skip wrote the frame that stops the run into ERRORS.partial and checkpointed it, though the
    checkpoint counts it as not done: once the file was completed, --resume classified the frame and the finished
    errors file still said it was truncated, so one input was both a result and an error."""
    whole = encode_frames(texts(4), [1, 2, 3, 4])
    source, out, errors = tmp_path / "in.frames", tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    source.write_bytes(whole[:-5])  # the last frame's user id cut short, as by a copy still going on
    flags = ("--out", str(out), "--on-error", "skip", "--errors", str(errors))
    assert classify(tiny_model_dir, str(source), *flags) == 1
    source.write_bytes(whole)
    assert classify(tiny_model_dir, str(source), *flags, "--resume") == 0
    assert [r["id"] for r in read_jsonl(out)] == [1, 2, 3, 4]
    assert errors.read_bytes() == b""
