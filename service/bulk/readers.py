"""Bulk input formats, read as streams: JSON lines, CSV, plain text (one text a line) and glassbox frame files.

Each reader yields `Item`s and `BadItem`s in input order and holds at most one record in memory. A bad record never
stops a reader by itself: it becomes a `BadItem` with its line number, and the caller decides (`--on-error`). Only a
frames file whose framing breaks cannot go on (`fatal`).

Bytes are checked as UTF-8 per record, so one bad byte costs its own line, not the rest of the file.
"""

from __future__ import annotations

import codecs
import csv
import io
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import msgspec

from glassbox.service.bulk.records import BadItem, Input, Item, Key
from glassbox.service.errors import InvalidRequestError

Format = Literal["jsonl", "csv", "text", "frames"]
FORMATS: tuple[Format, ...] = ("jsonl", "csv", "text", "frames")

_BY_SUFFIX: dict[str, Format] = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "csv", ".txt": "text",
    ".frames": "frames", ".gbf": "frames",
}
_BOM = b"\xef\xbb\xbf"
# Byte order marks of the encodings that are not UTF-8, UTF-32's first: its little-endian mark starts with UTF-16's.
_WIDE_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"),
)
_ESCAPED = re.compile("[\udc80-\udcff]")  # what surrogateescape makes of bytes that are not UTF-8
_LENGTH = struct.Struct("<I")
_USER_ID = struct.Struct("<Q")
# The longest text a record may hold. A CSV field may be a long document, and the csv module's default cap (128 KiB)
# would make it an error; a frame that declares more is broken framing (or not frames at all), not a text.
_TEXT_LIMIT = 256 * 1024 * 1024
# A frame's body is read this much at a time, so a length its input does not hold costs what arrives, not the length.
_READ_CHUNK = 1024 * 1024
_HEAD = 4  # bytes that tell UTF-16 and UTF-32 by their byte order mark
_PIPE_BUFFER = 64 * 1024  # stdin read this much at a time behind the bytes taken to look at


class InputError(InvalidRequestError):
    """The input as a whole cannot be read (no such file, no such column, unknown format): nothing is classified."""

    code = "invalid_input"


@dataclass(frozen=True, slots=True)
class Fields:
    """Where a record keeps its text, its optional second text and its optional id (JSON field or CSV column)."""

    text: str = "text"
    pair: str = "text_pair"
    id: str = "id"
    required: tuple[str, ...] = ()  # CSV columns that must be in the header besides the text's (asked for by name)


def detect_format(path: str, given: str | None) -> Format:
    if given:
        if given not in FORMATS:
            raise InputError(f"unknown input format {given!r}: one of {', '.join(FORMATS)}")
        return given
    if path == "-":
        raise InputError("reading stdin: say what it holds with --format (jsonl, csv, text or frames)")
    found = _BY_SUFFIX.get(Path(path).suffix.lower())
    if found is None:
        raise InputError(f"cannot tell the format of {path} from its name: pass --format (jsonl, csv, text or frames)")
    return found


@dataclass(frozen=True, slots=True)
class Source:
    """An opened input: its records, and how far into it the reader is (for a progress bar)."""

    records: Iterator[Input]
    size: int | None  # bytes, None for a pipe
    tell: Callable[[], int]  # bytes read so far (read-ahead included)


def read_input(path: str, fmt: Format, fields: Fields = Fields(), *, delimiter: str | None = None,
               stdin: BinaryIO | None = None) -> Source:
    """Every record of `path` (or of `stdin` when path is "-"), in order. Raises InputError before any record is
    read when the input cannot be opened (or a CSV header lacks a column, or it starts with a UTF-16 or UTF-32 byte
    order mark: stdin, unless it holds frames, is waited on here until its first 4 bytes or its end arrive)."""
    if path == "-":
        if stdin is None:
            raise InputError("no stdin to read")
        return Source(_piped(stdin, fmt, fields, delimiter, path), None, lambda: 0)
    file = Path(path)
    if not file.exists() or file.is_dir():
        raise InputError(f"{path} does not exist or is not a file")
    try:
        handle = file.open("rb")
    except OSError as exc:
        raise InputError(f"cannot open {path}: {exc.strerror}") from None
    if delimiter is None and file.suffix.lower() == ".tsv":
        delimiter = "\t"
    try:
        if not file.is_file():
            # A named pipe, or a shell's process substitution (`<(zcat big.jsonl.gz)`, a /dev/fd path): read as
            # stdin is, once through without seeking back.
            return Source(_piped(handle, fmt, fields, delimiter, path, close=True), None, lambda: 0)
        size = file.stat().st_size
        if fmt != "frames":
            _check_encoding(handle.read(4), path)
            handle.seek(0)
        records = _stream(handle, fmt, fields, delimiter, path, close=True)
    except BaseException:
        handle.close()
        raise
    # Closed: read to the end (a closed handle has no position, and the progress bar shows the last one).
    return Source(records, size, lambda: size if handle.closed else handle.tell())


def _piped(stream: BinaryIO, fmt: Format, fields: Fields, delimiter: str | None, source: str, *,
           close: bool = False) -> Iterator[Input]:
    """The records of a stream that cannot be seeked back (stdin, a pipe): its first bytes are looked at for a
    byte order mark, then read again from a buffer in front of the rest."""
    if fmt != "frames":
        head = _read_head(stream, _HEAD)
        _check_encoding(head, "stdin" if source == "-" else source)
        reader = io.BufferedReader(_Prefixed(head, stream), _PIPE_BUFFER)
        if close:
            return _closing(_stream(reader, fmt, fields, delimiter, source), stream)
        return _stream(reader, fmt, fields, delimiter, source)
    return _stream(stream, fmt, fields, delimiter, source, close=close)


def _read_head(stream: BinaryIO, size: int) -> bytes:
    """The first `size` bytes of a stream, fewer only at its end. One read (or peek) returns what one read(2) of the
    pipe delivered, which may be a single byte: UTF-32's mark would look like UTF-16's, or no mark at all."""
    head = b""
    while len(head) < size:
        chunk = stream.read(size - len(head))
        if not chunk:
            break
        head += chunk
    return head


class _Prefixed(io.RawIOBase):
    """A stream whose first bytes were already taken (to look at), read from its beginning again: those bytes, then
    the rest. A pipe cannot be seeked back to its start."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        self._head = head
        self._rest = rest
        # What is there now, without waiting for a whole buffer's worth: BufferedReader.read1, one raw read otherwise.
        self._read = getattr(rest, "read1", rest.read)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:  # buffer: any writable buffer (typeshed's WriteableBuffer)
        view = memoryview(buffer).cast("B")
        if self._head:
            taken = self._head[:len(view)]
            self._head = self._head[len(taken):]
        else:
            taken = self._read(len(view)) or b""
        view[:len(taken)] = taken
        return len(taken)


def _check_encoding(head: bytes, source: str) -> None:
    """Text, JSON lines and CSV are read as UTF-8 split at b"\\n": a UTF-16 or UTF-32 file would come out as
    NUL-interleaved garbage and be classified without a word. Its byte order mark gives it away."""
    for bom, name in _WIDE_BOMS:
        if head.startswith(bom):
            raise InputError(f"{source}: {name} input (BOM {bom.hex(' ').upper()}): convert it to UTF-8 "
                             f"(iconv -f {name} -t UTF-8)")


def _stream(handle: BinaryIO, fmt: Format, fields: Fields, delimiter: str | None, source: str, *,
            close: bool = False) -> Iterator[Input]:
    if fmt == "csv":
        records: Iterator[Input] = read_csv(handle, fields, delimiter or ",", source)
    elif fmt == "jsonl":
        records = read_jsonl(handle, fields)
    elif fmt == "text":
        records = read_text(handle)
    else:
        records = read_frames_stream(handle)
    return _closing(records, handle) if close else records


def _closing(records: Iterator[Input], handle: BinaryIO) -> Iterator[Input]:
    with handle:
        yield from records


def _lines(handle: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, the line without its end of line). A BOM at the start of the file is dropped."""
    for number, raw in enumerate(handle, start=1):
        line = raw[:-1] if raw.endswith(b"\n") else raw
        if line.endswith(b"\r"):
            line = line[:-1]
        if number == 1 and line.startswith(_BOM):
            line = line[len(_BOM):]
        yield number, line


def _utf8(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _bad_utf8(data: bytes) -> str:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not valid UTF-8 (byte {exc.start} of the line: {exc.reason})"
    return "not valid UTF-8"


def read_text(handle: BinaryIO) -> Iterator[Input]:
    """One text a line. An empty line is not a record and is passed over, as in JSON lines (an empty text has nothing
    to classify); a line of spaces is a text. The line number is the id either way."""
    position = 0
    for number, line in _lines(handle):
        if not line:
            continue
        text = _utf8(line)
        if text is None:
            yield BadItem(position, number, "invalid_utf8", _bad_utf8(line))
        else:
            yield Item(position, number, number, text)
        position += 1


_json = msgspec.json.Decoder()


def read_jsonl(handle: BinaryIO, fields: Fields) -> Iterator[Input]:
    """One JSON object a line: `fields.text` (a string), `fields.pair` (a string or null) and `fields.id` (a string or
    number), both optional. Blank lines are not records and are passed over."""
    position = 0
    for number, line in _lines(handle):
        if not line.strip():
            continue
        yield _json_record(line, position, number, fields)
        position += 1


def _json_record(line: bytes, position: int, number: int, fields: Fields) -> Input:
    try:
        record = _json.decode(line)
    except msgspec.DecodeError as exc:
        if _utf8(line) is None:
            return BadItem(position, number, "invalid_utf8", _bad_utf8(line))
        return BadItem(position, number, "invalid_json", f"not valid JSON: {exc}")
    except RecursionError:  # msgspec's own depth limit: `[[[[...` a hundred thousand deep
        return BadItem(position, number, "invalid_json", "not valid JSON here: nested too deeply")
    if not isinstance(record, dict):
        return BadItem(position, number, "invalid_json", f"a JSON {type(record).__name__}, not an object")
    text = record.get(fields.text)
    if not isinstance(text, str):
        what = "missing_field" if text is None else "invalid_field"
        return BadItem(position, number, what, f"needs a string field {fields.text!r}")
    pair = record.get(fields.pair)
    if pair is not None and not isinstance(pair, str):
        return BadItem(position, number, "invalid_field", f"field {fields.pair!r} must be a string or null")
    key = record.get(fields.id)
    if key is None:
        key = number
    elif isinstance(key, bool) or not isinstance(key, str | int | float):
        return BadItem(position, number, "invalid_field", f"field {fields.id!r} must be a string or a number")
    return Item(position, number, key, text, pair)


@dataclass(frozen=True, slots=True)
class _Columns:
    text: int
    pair: int | None
    id: int | None


def _columns(header: list[str], fields: Fields, source: str) -> _Columns:
    for name in (fields.text, *fields.required):
        if name not in header:
            raise InputError(f"{source}: no column {name!r} in the header {header}: name the columns with "
                             "--text-column (--pair-column, --id-column)")
    return _Columns(header.index(fields.text), header.index(fields.pair) if fields.pair in header else None,
                    header.index(fields.id) if fields.id in header else None)


def read_csv(handle: BinaryIO, fields: Fields, delimiter: str, source: str) -> Iterator[Input]:
    """A header row, then one record a row (a quoted field may span lines). `fields.pair` and `fields.id` are used
    when the header has them. The header is read and checked now: a missing column raises InputError here."""
    if len(delimiter) != 1 or delimiter in "\r\n\"":
        # csv.reader raises TypeError for these, which reached the user as a traceback.
        tab = " (for a tab, pass a real one: --delimiter $'\\t' in bash)" if delimiter == "\\t" else ""
        raise InputError(f"--delimiter must be one character, not a quote or an end of line: got {delimiter!r}{tab}")
    csv.field_size_limit(_TEXT_LIMIT)
    # surrogateescape keeps bytes that are not UTF-8 as lone surrogates, so the bad record is found (below) and the
    # rest of the file is still read.
    text = io.TextIOWrapper(handle, encoding="utf-8-sig", errors="surrogateescape", newline="")
    rows = csv.reader(text, delimiter=delimiter, strict=True)
    try:
        header = next(rows)
    except StopIteration:
        # An empty file holds no records. Detach the wrapper first: collected, it would close the handle under
        # `_closing`, which opens it on the first record asked for.
        text.detach()
        return iter(())
    except csv.Error as exc:
        raise InputError(f"{source}: the header row is not valid CSV: {exc}") from None
    if any(_ESCAPED.search(name) for name in header):
        raise InputError(f"{source}: the header row is not valid UTF-8")
    return _csv_rows(rows, _columns(header, fields, source), fields)


def _csv_rows(rows: Iterator[list[str]], columns: _Columns, fields: Fields) -> Iterator[Input]:
    position = 0
    while True:
        start = rows.line_num + 1  # type: ignore[attr-defined]
        try:
            row = next(rows)
        except StopIteration:
            return
        except csv.Error as exc:
            yield BadItem(position, start, "invalid_csv", f"not valid CSV: {exc}")
            position += 1
            continue
        if not row:
            continue  # a blank line between records
        yield _csv_record(row, columns, position, start, fields)
        position += 1


def _csv_record(row: list[str], columns: _Columns, position: int, line: int, fields: Fields) -> Input:
    if len(row) <= columns.text:
        return BadItem(position, line, "missing_field", f"{len(row)} fields: no value for column {fields.text!r}")
    values = [row[columns.text]]
    pair = row[columns.pair] if columns.pair is not None and columns.pair < len(row) else None
    key: Key = row[columns.id] if columns.id is not None and columns.id < len(row) else line
    values += [v for v in (pair, key) if isinstance(v, str)]
    if any(_ESCAPED.search(v) for v in values):
        return BadItem(position, line, "invalid_utf8", "not valid UTF-8")
    return Item(position, line, key, row[columns.text], pair or None)


def _truncated(number: int, message: str) -> BadItem:
    return BadItem(number - 1, number, "frame_truncated", message, fatal=True)


def _read_up_to(handle: BinaryIO, size: int) -> bytes:
    """`size` bytes, fewer only where the input ends. Read a chunk at a time: a buffered read(n) allocates n bytes
    before it reads any."""
    chunks: list[bytes] = []
    while size > 0:
        chunk = handle.read(min(size, _READ_CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_frames_stream(handle: BinaryIO) -> Iterator[Input]:
    """Frames from a file or a pipe, read frame by frame. A file is read, not mapped: a mapped file that shrinks
    while it is scanned (truncated, rewritten) kills the process with SIGBUS, where a read just comes up short and
    the frame it cuts is reported as `frame_truncated`."""
    number = 0
    while True:
        header = handle.read(_LENGTH.size)
        if not header:
            return
        number += 1
        if len(header) < _LENGTH.size:
            yield _truncated(number, f"{len(header)} byte(s) at the end: too few for a frame header")
            return
        (length,) = _LENGTH.unpack(header)
        if length > _TEXT_LIMIT:
            yield BadItem(number - 1, number, "invalid_frame",
                          f"the frame declares {length} text bytes, more than the {_TEXT_LIMIT} a text may hold: "
                          "the framing is broken, or the input is not frames", fatal=True)
            return
        body = _read_up_to(handle, length + _USER_ID.size)
        if len(body) < length + _USER_ID.size:
            yield _truncated(number, f"the frame declares {length} text bytes and an 8-byte user id, but the input "
                                     f"ends after {len(body)} bytes")
            return
        (user_id,) = _USER_ID.unpack_from(body, length)
        text = _utf8(body[:length])
        if text is None:
            yield BadItem(number - 1, number, "invalid_utf8", _bad_utf8(body[:length]))
        else:
            yield Item(number - 1, number, user_id, text)
