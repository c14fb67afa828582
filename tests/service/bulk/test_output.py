"""The output side of `glassbox classify`: partial files, checkpoints and the renames that finish a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from glassbox.service.bulk.output import AlreadyDone, ResumeError, Sink, _write_all


def committed(tmp_path: Path, good: bytes = b'{"id": 1}\n', bad: bytes = b'{"line": 2}\n',
              done: int = 2) -> tuple[Sink, Path, Path]:
    """A run to out.jsonl and errors.jsonl with one window written and checkpointed, not finished."""
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    sink = Sink(out, errors, {"input": "x"})
    assert sink.open(False, b"") == 0
    sink.write(good, bad)
    sink.commit(done)
    return sink, out, errors


def test_a_failed_rename_at_the_end_leaves_a_run_that_resume_finishes(tmp_path: Path) -> None:
    """The errors file is renamed first and the checkpoint dropped last: a rename that fails (here ERRORS turned
    into a directory mid-run) leaves the output's partial file and its checkpoint, not a run no one can resume."""
    sink, out, errors = committed(tmp_path)
    errors.mkdir()
    (errors / "keep").write_text("", encoding="utf-8")  # a non-empty directory: no rename replaces it
    with pytest.raises(OSError):
        sink.finish()
    sink.abandon()
    assert not out.exists() and (tmp_path / "out.jsonl.progress").exists()
    resume_after_clearing(errors, out, errors)
    assert not (tmp_path / "out.jsonl.progress").exists()


def resume_after_clearing(blocker: Path, out: Path, errors: Path) -> None:
    """Empty and remove the directory that blocked a rename, then --resume the run to its end: both files whole."""
    (blocker / "keep").unlink()
    blocker.rmdir()
    again = Sink(out, errors, {"input": "x"})
    assert again.open(True, b"") == 2
    again.finish()
    assert out.read_bytes() == b'{"id": 1}\n' and errors.read_bytes() == b'{"line": 2}\n'


class _Short:
    """A raw output that takes at most `step` bytes a write, then `last` (None: would block; 0: took nothing)."""

    def __init__(self, step: int, limit: int, last: int | None) -> None:
        self.step, self.limit, self.last = step, limit, last
        self.got = b""

    def write(self, data: bytes) -> int | None:
        if len(self.got) >= self.limit:
            return self.last
        taken = bytes(data[:self.step])
        self.got += taken
        return len(taken)


def test_short_writes_are_written_on_and_no_progress_is_an_error() -> None:
    """A raw stdout (PYTHONUNBUFFERED) takes part of a write and says so by its count, without raising."""
    whole = _Short(3, 100, 0)
    _write_all(whole, b"0123456789")  # type: ignore[arg-type]
    assert whole.got == b"0123456789"
    with pytest.raises(OSError, match="took no bytes after 6 of 10"):
        _write_all(_Short(3, 6, 0), b"0123456789")  # type: ignore[arg-type]
    with pytest.raises(BlockingIOError, match="would block after 6 of 10"):
        _write_all(_Short(3, 6, None), b"0123456789")  # type: ignore[arg-type]


def test_a_failed_rename_of_the_output_after_the_errors_file_is_finished_by_resume(tmp_path: Path) -> None:
    """The errors file was renamed, then the output's rename failed (OUTPUT had become a directory): its partial file
    gone, the errors file counted as lost and --resume refused the run the message told the user to resume."""
    sink, out, errors = committed(tmp_path)
    out.mkdir()
    (out / "keep").touch()  # a non-empty directory: no rename replaces it
    with pytest.raises(IsADirectoryError):
        sink.finish()
    sink.abandon()
    assert errors.read_bytes() == b'{"line": 2}\n' and not (tmp_path / "errors.jsonl.partial").exists()
    resume_after_clearing(out, out, errors)
    assert not (tmp_path / "out.jsonl.partial").exists() and not (tmp_path / "out.jsonl.progress").exists()
    with pytest.raises(AlreadyDone):
        Sink(out, errors, {"input": "x"}).open(True, b"")


def test_a_lost_partial_file_is_not_taken_for_one_renamed_by_an_earlier_run(tmp_path: Path) -> None:
    """ERRORS left by an earlier, finished run is not this run's: a partial file gone before the run got to its
    renames is lost, and --resume says so instead of finishing without it."""
    (tmp_path / "errors.jsonl").write_bytes(b'{"line": 99}\n')  # an earlier run's
    sink, out, errors = committed(tmp_path)
    sink.abandon()  # killed before finishing
    (tmp_path / "errors.jsonl.partial").unlink()
    with pytest.raises(ResumeError, match=r"errors\.jsonl\.partial is gone"):
        Sink(out, errors, {"input": "x"}).open(True, b"")


def test_both_files_in_place_and_only_the_checkpoint_left_is_done(tmp_path: Path) -> None:
    sink, out, errors = committed(tmp_path, bad=b"", done=1)
    progress = tmp_path / "out.jsonl.progress"
    kept = progress.read_bytes()
    sink.finish()
    progress.write_bytes(kept + b'{"finishing": 1}\n')  # as if the unlink had failed
    with pytest.raises(AlreadyDone):
        Sink(out, errors, {"input": "x"}).open(True, b"")
    assert not progress.exists() and out.read_bytes() == b'{"id": 1}\n'


def test_a_checkpoint_line_torn_by_a_full_disk_does_not_damage_the_next_resume(tmp_path: Path) -> None:
    """The disk filled up mid-way through a checkpoint line. --resume passed over that last line but appended its own
    checkpoints right after it, gluing the first to it: once that run was stopped too, every later --resume refused
    the file as damaged, and the work done could only be thrown away."""
    sink, out, errors = committed(tmp_path)
    sink.abandon()
    progress = tmp_path / "out.jsonl.progress"
    progress.write_bytes(progress.read_bytes() + b'{"done": 3, "ou')  # ENOSPC after 15 bytes of the line
    again = Sink(out, errors, {"input": "x"})
    assert again.open(True, b"") == 2
    for done in (3, 4):
        again.write(f'{{"id": {done}}}\n'.encode(), b"")
        again.commit(done)
    again.abandon()  # stopped again (a bad line, Ctrl-C)
    last = Sink(out, errors, {"input": "x"})
    assert last.open(True, b"") == 4
    last.finish()
    assert out.read_bytes() == b'{"id": 1}\n{"id": 3}\n{"id": 4}\n'


def test_a_second_run_into_the_same_output_is_refused_while_the_first_runs(tmp_path: Path) -> None:
    """A --resume started while the run it resumes still went (a cron job, a second terminal) cut the running
    run's partial file back to a checkpoint and wrote over it from its own offsets: both appended checkpoints to
    one file, and whichever finished second failed its rename. Now OUTPUT.lock is held for the run."""
    sink, out, errors = committed(tmp_path)
    for resume in (True, False):
        with pytest.raises(ResumeError, match=r"another run \(pid \d+\) is writing into"):
            Sink(out, errors, {"input": "x"}).open(resume, b"")
    assert (tmp_path / "out.jsonl.partial").read_bytes() == b'{"id": 1}\n'  # untouched
    sink.abandon()  # stopped: the lock goes with it
    again = Sink(out, errors, {"input": "x"})
    assert again.open(True, b"") == 2
    again.finish()
    assert not (tmp_path / "out.jsonl.lock").exists() and out.read_bytes() == b'{"id": 1}\n'


def test_a_lock_file_left_by_a_killed_run_does_not_block_the_next(tmp_path: Path) -> None:
    (tmp_path / "out.jsonl.lock").write_bytes(b"12345\n")  # SIGKILL: the file stays, its lock went with the process
    sink, out, _ = committed(tmp_path)
    sink.finish()
    assert out.read_bytes() == b'{"id": 1}\n' and not (tmp_path / "out.jsonl.lock").exists()


def test_a_partial_file_shorter_than_its_checkpoint_is_not_padded_and_published(tmp_path: Path) -> None:
    """truncate() to the checkpoint's length lengthens a shorter file with NUL bytes: a partial file cut since (by
    hand, a restore, a broken copy) was resumed into a final output with runs of NULs inside its rows, exit 0."""
    sink, out, errors = committed(tmp_path)
    sink.abandon()
    (tmp_path / "out.jsonl.partial").write_bytes(b'{"id"')
    with pytest.raises(ResumeError, match=r"out\.jsonl\.partial holds 5 bytes, fewer than the 10 its checkpoint"):
        Sink(out, errors, {"input": "x"}).open(True, b"")
    assert (tmp_path / "out.jsonl.partial").read_bytes() == b'{"id"' and not out.exists()
