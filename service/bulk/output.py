"""Where `glassbox classify` writes: rows encoded as JSON lines or CSV, into temporary files renamed on success,
with a checkpoint after every window so that `--resume` neither repeats nor loses a line.

OUTPUT is written as `OUTPUT.partial` (the errors file as `ERRORS.partial`); after each window both are flushed to
disk and `OUTPUT.progress` gets one JSON line: how many inputs are done and how many bytes of each file hold them. A
run killed at any instant leaves files whose first `bytes` are whole windows; `--resume` cuts them back to the last
checkpoint and reads on from the input after it. On success the progress file records that the run is finishing, the
partial files are renamed over OUTPUT and ERRORS (one rename each: a reader sees the old file or the new one, never
half of one) and the progress file goes; a run stopped between the renames is finished by --resume. A run holds an
flock on `OUTPUT.lock` from start to end, so that a second run into the same OUTPUT is refused.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import fcntl
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import msgspec

from glassbox.service.bulk.records import BadItem, Item
from glassbox.service.errors import InvalidRequestError

OutputFormat = Literal["jsonl", "csv"]
PARTIAL = ".partial"
PROGRESS = ".progress"
LOCK = ".lock"


class ResumeError(InvalidRequestError):
    """--resume cannot continue (the checkpoint belongs to another input or options), or a run left partial files
    and --resume was not given."""

    code = "cannot_resume"


class AlreadyDone(Exception):  # not an error: the command says so and exits 0
    """--resume found OUTPUT complete and no partial run."""


def output_format(path: str, given: str | None) -> OutputFormat:
    if given in ("jsonl", "csv"):
        return given  # type: ignore[return-value]
    if given:
        raise InvalidRequestError(f"unknown output format {given!r}: jsonl or csv")
    return "csv" if path.lower().endswith((".csv", ".tsv")) else "jsonl"


def output_delimiter(path: str) -> str:
    """CSV output into a file named .tsv is tab-separated, as a .tsv input is read."""
    return "\t" if path.lower().endswith(".tsv") else ","


class RowEncoder:
    """Results -> bytes. JSON lines: `{"id", "label", "score", "truncated"[, "scores"]}` (no label for a regression
    head). CSV: the same as columns, `score_<label>` for each label with all scores."""

    def __init__(self, fmt: OutputFormat, labels: Sequence[str], *, regression: bool, all_scores: bool,
                 delimiter: str = ",") -> None:
        self.fmt = fmt
        self.delimiter = delimiter  # CSV: a tab for an OUTPUT named .tsv
        self.labels = tuple(labels)
        self.regression = regression
        self.all_scores = all_scores and not regression
        self._json = msgspec.json.Encoder()

    def header(self) -> bytes:
        if self.fmt != "csv":
            return b""
        names = ["id", *(() if self.regression else ("label",)), "score", "truncated"]
        if self.all_scores:
            names += [f"score_{label}" for label in self.labels]
        return _csv_line(names, self.delimiter)

    def encode(self, items: Sequence[Item], columns: dict[str, list[Any]]) -> bytes:
        """`columns` as Classifier.columns gives them, row i for items[i]."""
        if not items:
            return b""
        scores = columns["score"]
        truncated = columns["truncated"]
        labels = columns.get("label")
        every = columns.get("scores") if self.all_scores else None
        if self.fmt == "jsonl":
            lines = []
            for i, item in enumerate(items):
                row: dict[str, Any] = {"id": item.key}
                if labels is not None:
                    row["label"] = labels[i]
                row["score"] = scores[i]
                row["truncated"] = truncated[i]
                if every is not None:
                    row["scores"] = every[i]
                lines.append(self._json.encode(row))
            return b"\n".join(lines) + b"\n"
        buffer = io.StringIO()
        writer = csv.writer(buffer, delimiter=self.delimiter, lineterminator="\n")
        for i, item in enumerate(items):
            values: list[Any] = [item.key]
            if labels is not None:
                values.append(labels[i])
            values += [scores[i], "true" if truncated[i] else "false"]
            if every is not None:
                values += [every[i][label] for label in self.labels]
            writer.writerow(values)
        return buffer.getvalue().encode("utf-8")


def _csv_line(values: Sequence[str], delimiter: str = ",") -> bytes:
    buffer = io.StringIO()
    csv.writer(buffer, delimiter=delimiter, lineterminator="\n").writerow(values)
    return buffer.getvalue().encode("utf-8")


def encode_errors(bad: Sequence[BadItem]) -> bytes:
    """The errors file: one JSON line per bad input, `{"line", "code", "message"}`."""
    return b"".join(msgspec.json.encode({"line": b.line, "code": b.code, "message": b.message}) + b"\n" for b in bad)


def check_paths(paths: dict[str, Path | None], source: Path | None = None) -> None:
    """Refuse now, before the model loads, what the run could only fail on at its end, after the whole input was
    classified: a path that is a directory, one that cannot be created, one file given for two roles (`{flag:
    path}`, None for a flag not given), or the input file itself (`source`), which the rename at the end would
    replace with the results. A missing parent directory is fine: the run creates it."""
    seen: dict[Path, str] = {} if source is None else {source.resolve(): "the input"}
    for flag, path in paths.items():
        if path is None:
            continue
        resolved = path.resolve()
        if resolved in seen:
            raise InvalidRequestError(f"{flag} {path} is also {seen[resolved]}: give each its own file")
        seen[resolved] = flag
        problem = _unwritable(path)
        if problem is not None:
            raise InvalidRequestError(f"{flag} {path}: {problem}")


def written_in_place(path: Path) -> bool:
    """/dev/null, /dev/stdout, a named pipe: a path that is there and is neither a regular file nor a directory is
    written as it goes, as stdout is. Its PATH.partial renamed over it at the end replaced it with a regular file
    (run as root, /dev/null itself)."""
    return path.exists() and not path.is_file() and not path.is_dir()


def _unwritable(path: Path) -> str | None:
    if path.is_dir():
        return "is a directory: name a file"
    if written_in_place(path):
        return None if os.access(path, os.W_OK) else "cannot be written"
    parent = path.parent
    while not parent.exists():  # created by the run
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create files in {parent}"
    return None


@dataclass(frozen=True, slots=True)
class Checkpoint:
    done: int  # inputs (good and bad) whose outcome is on disk
    out: int  # bytes of the output file that hold them
    errors: int  # bytes of the errors file
    finishing: bool = False  # the run began renaming its files after this checkpoint (Sink.finish)


class _File:
    """A file written as PATH.partial and renamed to PATH at the end; or stdout (or a device or pipe, see
    written_in_place), written as it goes."""

    def __init__(self, path: Path | None, stream: IO[bytes] | None) -> None:
        self.device = path if path is not None and written_in_place(path) else None
        path = None if self.device is not None else path
        self.path = path
        self.partial = None if path is None else path.with_name(path.name + PARTIAL)
        self._stream = stream
        self.handle: IO[bytes] | None = None
        self.placed = False  # renamed into place by the run being resumed, before a later rename failed

    def open(self, resume_at: int | None) -> None:
        if self.placed:
            return
        if self.partial is None:
            self.handle = self._stream if self.device is None else self.device.open("wb")
            return
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        if resume_at is None:
            self.handle = self.partial.open("wb")
            return
        self.handle = self.partial.open("r+b")
        size = os.fstat(self.handle.fileno()).st_size
        if size < resume_at:
            # truncate() would pad it with NUL bytes up to the checkpoint, and they would be published as rows.
            self.close()
            raise ResumeError(f"{self.partial} holds {size} bytes, fewer than the {resume_at} its checkpoint "
                              "counts: it was cut or replaced since, so the run cannot be resumed: start a new one")
        self.handle.truncate(resume_at)  # bytes written after the last checkpoint belong to no finished window
        self.handle.seek(resume_at)

    def write(self, data: bytes) -> None:
        if data and self.placed:
            # The run being resumed had read its whole input when it put this file in place: only an input that grew
            # since brings more, and its rows have no file to go to.
            raise ResumeError(f"{self.path} was already put in place when the run being resumed finished; its input "
                              "has grown since: start a new run")
        if data and self.handle is not None:
            _write_all(self.handle, data)

    def sync(self) -> int:
        """Flush to disk; the bytes written so far."""
        if self.handle is None:
            return 0
        self.handle.flush()
        if self.partial is None:
            return 0
        os.fsync(self.handle.fileno())
        return self.handle.tell()

    def finish(self) -> None:
        self.close()
        if self.partial is not None and self.path is not None and not self.placed:
            os.replace(self.partial, self.path)
            self.placed = True

    def close(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None and (self.partial is not None or self.device is not None):  # not stdout
            handle.close()


def _drop_torn_line(path: Path) -> None:
    """Cut a last line written only in part (the disk filled up, or the machine died, mid-write) off the checkpoint
    file. _checkpoint passes over such a line when it is the last one; appended after, the next checkpoint would be
    glued to it into a damaged line in the middle, which every later --resume refuses."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)


def _write_all(handle: IO[bytes], data: bytes) -> None:
    """Write every byte of `data`, or raise. A BufferedWriter loops and raises by itself, but stdout is a raw FileIO
    under PYTHONUNBUFFERED=1 (or `python -u`): one write(2), whose count comes up short on a pipe whose reader left
    mid-write, and which returns None where a non-blocking stdout would block. Ignoring the count lost the rest of the
    output and the run ended with exit 0; writing on from where the short write stopped gets the broken pipe's EPIPE
    (exit 141 on stdout, see glassbox.service.cli) or the real error, and no progress at all is an error of its own."""
    view = memoryview(data)
    while view:
        written = handle.write(view)
        if written is None:
            raise BlockingIOError(errno.EAGAIN, f"the output would block after {len(data) - len(view)} of "
                                                f"{len(data)} bytes (non-blocking output)")
        if written <= 0:
            raise OSError(errno.EIO, f"the output took no bytes after {len(data) - len(view)} of {len(data)}")
        view = view[written:]


class Sink:
    """The output and errors files of one run, with their checkpoint (see the module docstring)."""

    def __init__(self, out: Path | None, errors: Path | None, identity: dict[str, Any], *,
                 stdout: IO[bytes] | None = None) -> None:
        self.out = _File(out, stdout)
        self.errors = _File(errors, None) if errors is not None else None
        self.identity = identity  # what the checkpoint must match to be resumed: input, formats, options
        out = self.out.path  # None for stdout, a device or a pipe: no checkpoint, no lock
        self.progress = None if out is None else out.with_name(out.name + PROGRESS)
        self._progress: IO[str] | None = None
        self._done = 0  # the inputs counted by the last checkpoint
        self.lock = None if out is None else out.with_name(out.name + LOCK)
        self._lock: IO[bytes] | None = None

    def open(self, resume: bool, header: bytes) -> int:
        """Open for writing; the number of inputs already done (0 unless resuming). Raises ResumeError, AlreadyDone.
        Holds OUTPUT.lock until the run finishes or stops: a second run into the same OUTPUT (a --resume started
        while the first still runs) would cut the first's files back to its checkpoint and write over them."""
        self._take_lock()
        try:
            return self._open(resume, header)
        except BaseException:
            self._release_lock()
            raise

    def _take_lock(self) -> None:
        if self.lock is None:
            return
        self.lock.parent.mkdir(parents=True, exist_ok=True)
        while True:
            handle = self.lock.open("a+b")
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().decode("ascii", "replace").strip()
                handle.close()
                raise ResumeError(f"another run (pid {holder or '?'}) is writing into {self.out.path}: wait for it to "
                                  f"end or stop it ({self.lock} is its lock)") from None
            try:
                current = self.lock.stat().st_ino == os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                current = False
            if current:
                handle.truncate(0)
                handle.write(f"{os.getpid()}\n".encode("ascii"))
                handle.flush()
                self._lock = handle
                return
            handle.close()  # the run that held it finished and removed it just now: take the new one

    def _release_lock(self) -> None:
        handle, self._lock = self._lock, None
        if handle is not None and self.lock is not None:
            try:
                self.lock.unlink(missing_ok=True)  # while still held: whoever opened it since sees it is not current
            finally:
                handle.close()

    def _open(self, resume: bool, header: bytes) -> int:
        checkpoint = self._checkpoint() if resume else None
        if resume and checkpoint is None and self.out.path is not None and self.out.path.exists():
            raise AlreadyDone(f"{self.out.path} is complete (no partial run to resume)")
        if not resume and self.progress is not None and self.progress.exists():
            raise ResumeError(f"{self.progress} says an earlier run into {self.out.path} did not finish: pass --resume "
                              f"to continue it, or delete {self.progress} and {self.out.partial} to start again")
        self.out.open(None if checkpoint is None else checkpoint.out)
        if self.errors is not None:
            self.errors.open(None if checkpoint is None else checkpoint.errors)
        if checkpoint is None:
            self.out.write(header)
            if self.progress is not None:
                self._progress = self.progress.open("w", encoding="utf-8")
                self._append({"run": self.identity})
            self.commit(0)
            return 0
        assert self.progress is not None
        if self.out.placed and (self.errors is None or self.errors.placed):  # only the checkpoint was left to drop
            self.progress.unlink()
            raise AlreadyDone(f"{self.out.path} is complete (the run had put it in place)")
        _drop_torn_line(self.progress)
        self._progress = self.progress.open("a", encoding="utf-8")
        self._done = checkpoint.done
        return checkpoint.done

    def _checkpoint(self) -> Checkpoint | None:
        if self.progress is None:
            raise ResumeError("--resume needs --out FILE: output to stdout (or a device or a pipe) cannot be resumed")
        if not self.progress.exists():
            return None
        found: Checkpoint | None = None
        lines = self.progress.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            try:
                entry = json.loads(line)
            except ValueError:
                if number == len(lines) - 1:
                    break  # the last line was being written when the run was killed
                raise ResumeError(f"{self.progress}:{number + 1} is damaged; delete it to start again") from None
            if "run" in entry and entry["run"] != self.identity:
                was = entry["run"] if isinstance(entry["run"], dict) else {}
                differ = ", ".join(f"{key} {was.get(key)!r}, now {self.identity.get(key)!r}"
                                   for key in sorted({*was, *self.identity}) if was.get(key) != self.identity.get(key))
                raise ResumeError(f"{self.progress} belongs to a run with other inputs or options ({differ})")
            if "done" in entry:
                found = Checkpoint(entry["done"], entry["out"], entry["errors"])
            elif "finishing" in entry and found is not None and entry["finishing"] == found.done:
                found = Checkpoint(found.done, found.out, found.errors, finishing=True)
        if found is not None:
            for file in (self.out, self.errors):
                if file is None or file.partial is None or file.path is None or file.partial.exists():
                    continue
                # A partial file that is gone was renamed into place only if this run's checkpoint says it got to
                # its renames; otherwise it is lost (deleted, or never made), and a file at PATH is another run's.
                if not (found.finishing and file.path.is_file()):
                    raise ResumeError(f"{file.partial} is gone, so the run cannot be resumed; delete {self.progress} "
                                      "to start again")
                file.placed = True
        return found

    def write(self, rows: bytes, bad: bytes) -> None:
        self.out.write(rows)
        if self.errors is not None:
            self.errors.write(bad)

    def commit(self, done: int) -> None:
        """Everything written so far reaches the disk, then the checkpoint that counts it."""
        out = self.out.sync()
        errors = self.errors.sync() if self.errors is not None else 0
        if self._progress is not None:
            self._append({"done": done, "out": out, "errors": errors})
        self._done = done

    def _append(self, entry: dict[str, Any]) -> None:
        assert self._progress is not None
        self._progress.write(json.dumps(entry) + "\n")
        self._progress.flush()
        os.fsync(self._progress.fileno())

    def finish(self) -> None:
        """Record that the run is finishing, rename the partial files into place, then drop the checkpoint. If a
        rename fails, the checkpoint is still there and says the run got to its renames, so --resume takes a final
        file whose partial is gone as renamed already and renames the rest; without that record a missing partial
        file is a lost one (see _checkpoint)."""
        if self._progress is not None:
            self._append({"finishing": self._done})
        if self.errors is not None:
            self.errors.finish()
        self.out.finish()
        if self._progress is not None:
            self._progress.close()
        if self.progress is not None:
            self.progress.unlink(missing_ok=True)
        self._release_lock()

    def abandon(self) -> None:
        """Stop, keeping the partial files and the checkpoint for --resume. Never raises: it runs on the way out of a
        failed write (a full disk), where closing flushes the same unwritten bytes and fails again; a file closes
        all the same, and what it did not take lies past the last checkpoint, which --resume cuts back to."""
        progress, self._progress = self._progress, None
        for file in (self.out, self.errors, progress):
            if file is None:
                continue
            with contextlib.suppress(OSError):
                file.close()
        with contextlib.suppress(OSError):
            self._release_lock()
