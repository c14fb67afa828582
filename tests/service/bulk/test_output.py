"""The output side of `glassbox classify`: partial files, checkpoints and the renames that finish a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.bulk.output import Sink, _write_all


def test_a_failed_rename_at_the_end_leaves_a_run_that_resume_finishes(tmp_path: Path) -> None:
    """The errors file is renamed first and the checkpoint dropped last: a rename that fails (here ERRORS turned
    into a directory mid-run) leaves the output's partial file and its checkpoint, not a run no one can resume."""
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    sink = Sink(out, errors, {"input": "x"})
    assert sink.open(False, b"") == 0
    sink.write(b'{"id": 1}\n', b'{"line": 2}\n')
    sink.commit(2)
    errors.mkdir()
    (errors / "keep").write_text("", encoding="utf-8")  # a non-empty directory: no rename replaces it
    with pytest.raises(OSError):
        sink.finish()
    sink.abandon()
    assert not out.exists() and (tmp_path / "out.jsonl.progress").exists()
    (errors / "keep").unlink()
    errors.rmdir()
    again = Sink(out, errors, {"input": "x"})
    assert again.open(True, b"") == 2
    again.finish()
    assert out.read_bytes() == b'{"id": 1}\n' and errors.read_bytes() == b'{"line": 2}\n'
    assert not (tmp_path / "out.jsonl.progress").exists()


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
