"""Each input format read as a stream: records in order with line numbers, bad records as BadItems, not errors."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from glassbox.service.bulk import readers
from glassbox.service.bulk.readers import Fields, InputError, detect_format, read_input
from glassbox.service.bulk.records import BadItem, Item
from glassbox.service.wire.frames import encode_frames

ROOT = Path(__file__).resolve().parents[3]


def records(path: Path, fmt: readers.Format, fields: Fields | None = None) -> list[Item | BadItem]:
    return list(read_input(str(path), fmt, fields or Fields()).records)


def test_text_lines_number_every_line_and_pass_over_empty_ones(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(b"\xef\xbb\xbffirst\r\n\n  \nthird \xff bad\r\n\r\nlast without newline")
    got = records(path, "text")
    assert [type(r).__name__ for r in got] == ["Item", "Item", "BadItem", "Item"]
    first, spaces, bad, last = got
    assert isinstance(first, Item) and (first.text, first.line, first.key, first.position) == ("first", 1, 1, 0)
    assert isinstance(spaces, Item) and (spaces.text, spaces.line, spaces.position) == ("  ", 3, 1)  # a text
    assert isinstance(bad, BadItem) and (bad.line, bad.code, bad.position) == (4, "invalid_utf8", 2)
    assert isinstance(last, Item) and (last.text, last.line, last.key, last.position) == ("last without newline", 6,
                                                                                           6, 3)


def test_json_lines_fields_ids_pairs_and_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join([
        b'{"id": "a", "text": "one", "text_pair": "two"}',
        b"",  # blank: not a record
        b'{"text": "no id"}',
        b"{not json",
        b'{"body": "wrong field"}',
        b'{"text": 5}',
        b'["a list"]',
        b'{"text": "caf\xc3 broken"}',
        b'{"text": "id must be scalar", "id": [1]}',
    ]) + b"\n")
    got = records(path, "jsonl")
    assert isinstance(got[0], Item) and (got[0].key, got[0].text, got[0].pair, got[0].line) == ("a", "one", "two", 1)
    assert isinstance(got[1], Item) and (got[1].key, got[1].line, got[1].position) == (3, 3, 1)
    codes = [(r.line, r.code) for r in got[2:] if isinstance(r, BadItem)]
    assert codes == [(4, "invalid_json"), (5, "missing_field"), (6, "invalid_field"), (7, "invalid_json"),
                     (8, "invalid_utf8"), (9, "invalid_field")]
    assert [r.position for r in got] == list(range(8))


def test_json_lines_nested_past_the_decoders_depth_limit_are_bad_lines(tmp_path: Path) -> None:
    """msgspec raises RecursionError, not DecodeError, for `[[[[...` deep enough: it reached the user as a traceback
    and stopped the run whatever --on-error said."""
    path = tmp_path / "in.jsonl"
    deep = b"[" * 100_000 + b"]" * 100_000
    path.write_bytes(deep + b'\n{"text": "ok", "x": ' + deep + b'}\n{"text": "fine"}\n')
    got = records(path, "jsonl")
    assert [(r.line, r.code) for r in got if isinstance(r, BadItem)] == [(1, "invalid_json"), (2, "invalid_json")]
    assert isinstance(got[2], Item) and got[2].text == "fine"


def test_json_lines_custom_field_names(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"review": "good", "n": 7, "other": "x"}\n', encoding="utf-8")
    (item,) = records(path, "jsonl", Fields(text="review", pair="other", id="n"))
    assert isinstance(item, Item) and (item.text, item.pair, item.key) == ("good", "x", 7)


def test_csv_quoted_multiline_fields_columns_and_bad_bytes(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_bytes(b'id,review\n1,"spans\ntwo lines, with a comma"\n\n2,plain\n3\n4,bad \xfe byte\n5,after\n')
    got = records(path, "csv", Fields(text="review"))
    assert isinstance(got[0], Item) and (got[0].text, got[0].key, got[0].line) == ("spans\ntwo lines, with a comma",
                                                                                  "1", 2)
    assert isinstance(got[1], Item) and (got[1].text, got[1].line) == ("plain", 5)
    assert isinstance(got[2], BadItem) and (got[2].code, got[2].line) == ("missing_field", 6)
    assert isinstance(got[3], BadItem) and (got[3].code, got[3].line) == ("invalid_utf8", 7)
    assert isinstance(got[4], Item) and got[4].text == "after"
    assert [r.position for r in got] == [0, 1, 2, 3, 4]


def test_csv_without_the_text_column_is_refused_before_any_record(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text("id,body\n1,x\n", encoding="utf-8")
    with pytest.raises(InputError, match="no column 'text'"):
        read_input(str(path), "csv")
    with pytest.raises(InputError, match="no column 'key'"):
        read_input(str(path), "csv", Fields(text="body", id="key", required=("key",)))


def test_empty_csv_holds_no_records(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_bytes(b"")
    assert records(path, "csv") == []


@pytest.mark.parametrize(("encoding", "name", "bom"), [
    ("utf-16-le", "UTF-16", "FF FE"), ("utf-16-be", "UTF-16", "FE FF"),
    ("utf-32-le", "UTF-32", "FF FE 00 00"), ("utf-32-be", "UTF-32", "00 00 FE FF"),
])
def test_utf16_and_utf32_input_is_refused_by_its_bom(tmp_path: Path, encoding: str, name: str, bom: str) -> None:
    """Read as UTF-8 lines, such a file would be classified as NUL-interleaved garbage."""
    data = "\ufeffgood film\nbad film\n".encode(encoding)
    for fmt, suffix in (("text", ".txt"), ("jsonl", ".jsonl"), ("csv", ".csv")):
        path = tmp_path / f"in{suffix}"
        path.write_bytes(data)
        with pytest.raises(InputError, match=f"{name} input \\(BOM {bom}\\): convert it to UTF-8"):
            read_input(str(path), fmt)
    stdin = io.BufferedReader(io.BytesIO(data))  # type: ignore[arg-type]
    with pytest.raises(InputError, match=f"stdin: {name} input"):
        read_input("-", "text", stdin=stdin)


class _Trickle(io.RawIOBase):
    """A pipe whose every read brings one byte, as a slow writer (`(head -c1 f; sleep 3; tail -c +2 f) |`) does."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._data:
            return 0
        memoryview(buffer)[0] = self._data[0]
        self._data = self._data[1:]
        return 1


@pytest.mark.parametrize("buffered", [True, False], ids=["stdin.buffer", "raw"])
@pytest.mark.parametrize(("encoding", "name"), [("utf-16-le", "UTF-16"), ("utf-32-le", "UTF-32")])
def test_a_wide_bom_on_stdin_is_found_however_its_bytes_arrive(buffered: bool, encoding: str, name: str) -> None:
    """A look at what one read delivered (peek) saw FF alone and classified UTF-16 as garbage, and took UTF-32's
    FF FE for UTF-16's; a raw stdin was not looked at at all."""
    data = "\ufeffA wonderful film.\nTerrible, boring.\n".encode(encoding)
    stdin: Any = io.BufferedReader(_Trickle(data)) if buffered else _Trickle(data)
    with pytest.raises(InputError, match=f"stdin: {name} input"):
        read_input("-", "text", stdin=stdin)


@pytest.mark.parametrize("buffered", [True, False], ids=["stdin.buffer", "raw"])
def test_utf8_on_stdin_a_byte_at_a_time_is_read_whole_after_the_look_at_its_start(buffered: bool) -> None:
    """The bytes taken to look for a byte order mark are put back in front of the rest of the stream."""
    lines = ["\ufeffcafé crème", "", "x" * 20_000, "naïve — ok", "last"]
    data = "\n".join(lines).encode("utf-8")
    stdin: Any = io.BufferedReader(_Trickle(data)) if buffered else _Trickle(data)
    got = list(read_input("-", "text", stdin=stdin).records)
    assert [r.text for r in got if isinstance(r, Item)] == ["café crème", *lines[2:]]  # the empty line passed over
    assert [r.line for r in got] == [1, 3, 4, 5]
    stdin = _Trickle(b'{"text": "hi"}')  # shorter than the bytes looked at
    short = list(read_input("-", "jsonl", stdin=stdin).records)
    assert [(r.text, r.key) for r in short if isinstance(r, Item)] == [("hi", 1)]
    stdin = _Trickle(b"ab")
    (two,) = read_input("-", "text", stdin=stdin).records
    assert isinstance(two, Item) and two.text == "ab"


def test_tsv_uses_tabs(tmp_path: Path) -> None:
    path = tmp_path / "in.tsv"
    path.write_text("text\tid\nhello, world\t9\n", encoding="utf-8")
    (item,) = records(path, detect_format(str(path), None))
    assert isinstance(item, Item) and (item.text, item.key) == ("hello, world", "9")


def test_frames_file_read_frame_by_frame(tmp_path: Path) -> None:
    path = tmp_path / "in.frames"
    path.write_bytes(encode_frames(["héllo", "wörld", ""], [7, 2**64 - 1, 0]))
    source = read_input(str(path), "frames")
    got = list(source.records)
    assert [(r.key, r.text) for r in got if isinstance(r, Item)] == [(7, "héllo"), (2**64 - 1, "wörld"), (0, "")]
    assert source.tell() == path.stat().st_size


# Reads one frame of a large frames file, truncates the file to 100 bytes, then reads on.
_TRUNCATE_WHILE_READING = """
import os, sys
from glassbox.service.bulk.readers import read_input
from glassbox.service.wire.frames import encode_frames
path = sys.argv[1]
with open(path, "wb") as handle:
    handle.write(encode_frames(["x" * 1000] * 200, list(range(200))))
records = read_input(path, "frames").records
next(records)
os.truncate(path, 100)
print([getattr(r, "code", "ok") for r in records][-1])
"""


def test_a_frames_file_truncated_while_read_is_a_truncated_frame_not_sigbus(tmp_path: Path) -> None:
    """A mapped file that shrank under the scan killed the process with SIGBUS; a read comes up short instead."""
    run = subprocess.run([sys.executable, "-c", _TRUNCATE_WHILE_READING, str(tmp_path / "in.frames")],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert run.returncode == 0, (run.returncode, run.stderr)
    assert run.stdout.strip() == "frame_truncated"  # after the frames read ahead before the cut


def test_frames_bad_utf8_is_skippable_and_a_truncated_tail_is_fatal(tmp_path: Path) -> None:
    good = encode_frames(["ok"], [1])
    bad_text = b"\x02\x00\x00\x00\xff\xfe" + (5).to_bytes(8, "little")
    path = tmp_path / "in.frames"
    path.write_bytes(good + bad_text + good + b"\x09\x00\x00\x00abc")
    got = records(path, "frames")
    assert isinstance(got[1], BadItem) and got[1].code == "invalid_utf8" and not got[1].fatal
    assert isinstance(got[2], Item) and got[2].line == 3
    assert isinstance(got[3], BadItem) and got[3].code == "frame_truncated" and got[3].fatal and got[3].line == 4
    stream = list(read_input("-", "frames", stdin=io.BytesIO(path.read_bytes())).records)
    assert [(type(r).__name__, r.line) for r in stream] == [(type(r).__name__, r.line) for r in got]


class _Reads(io.BytesIO):
    """A stream that remembers the sizes asked of read()."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.asked: list[int] = []

    def read(self, size: int | None = -1, /) -> bytes:
        self.asked.append(-1 if size is None else size)
        return super().read(size)


def test_frames_length_past_the_text_limit_is_an_invalid_frame_read_without_allocating_it() -> None:
    stdin = _Reads(b"\xff\xff\xff\xfe")  # declares 4 GiB - 1 of text
    (bad,) = read_input("-", "frames", stdin=stdin).records
    assert isinstance(bad, BadItem) and (bad.code, bad.fatal, bad.line) == ("invalid_frame", True, 1)
    assert max(stdin.asked) <= 1024 * 1024
    # A declared length under the limit that the input does not hold is read a chunk at a time too.
    stdin = _Reads((200 * 1024 * 1024).to_bytes(4, "little") + b"short")
    (cut,) = read_input("-", "frames", stdin=stdin).records
    assert isinstance(cut, BadItem) and cut.code == "frame_truncated" and "ends after 5 bytes" in cut.message
    assert max(stdin.asked) <= 1024 * 1024


def test_frames_text_longer_than_a_read_chunk(tmp_path: Path) -> None:
    text = "ab" * 1_500_000  # 3 MB: three chunks
    (item,) = read_input("-", "frames", stdin=io.BytesIO(encode_frames([text], [9]))).records
    assert isinstance(item, Item) and (item.text, item.key) == (text, 9)


def test_empty_frames_file_holds_no_records(tmp_path: Path) -> None:
    path = tmp_path / "empty.frames"
    path.write_bytes(b"")
    assert records(path, "frames") == []


def test_format_from_the_name_or_refused(tmp_path: Path) -> None:
    assert detect_format("a.JSONL", None) == "jsonl"
    assert detect_format("a.unknown", "text") == "text"
    with pytest.raises(InputError, match="--format"):
        detect_format("a.unknown", None)
    with pytest.raises(InputError, match="stdin"):
        detect_format("-", None)
    with pytest.raises(InputError, match="does not exist"):
        read_input(str(tmp_path / "missing.txt"), "text")


@pytest.mark.parametrize("delimiter", [";;", "\\t", '"', "\n"])
def test_a_delimiter_csv_cannot_use_is_refused_before_any_record(tmp_path: Path, delimiter: str) -> None:
    """csv.reader raised TypeError for a delimiter of two characters (`--delimiter '\\t'` typed in a shell is two):
    a traceback instead of one line."""
    path = tmp_path / "in.csv"
    path.write_text("text\nx\n", encoding="utf-8")
    with pytest.raises(InputError, match="--delimiter must be one character"):
        read_input(str(path), "csv", delimiter=delimiter)


@pytest.mark.parametrize(("fmt", "data"), [
    ("jsonl", b'{"text": "good"}\n{"text": "bad"}\n'),
    ("csv", b"\xef\xbb\xbftext\ngood\nbad\n"),
    ("frames", encode_frames(["good", "bad"], [1, 2])),
])
def test_a_named_pipe_is_read_as_stdin_is(tmp_path: Path, fmt: readers.Format, data: bytes) -> None:
    """`glassbox classify <(zcat big.jsonl.gz) --format jsonl` (a /dev/fd path) and a named pipe were refused as
    'does not exist or is not a file': only regular files were read, and they are seeked back after their BOM."""
    pipe = tmp_path / "in.pipe"
    os.mkfifo(pipe)
    writer = threading.Thread(target=pipe.write_bytes, args=(data,), daemon=True)
    writer.start()
    source = read_input(str(pipe), fmt)
    got = list(source.records)
    writer.join(timeout=10)
    assert source.size is None
    assert [r.text for r in got if isinstance(r, Item)] == ["good", "bad"]


def test_a_utf16_named_pipe_is_refused_by_its_bom(tmp_path: Path) -> None:
    pipe = tmp_path / "in.pipe"
    os.mkfifo(pipe)
    writer = threading.Thread(target=pipe.write_bytes, args=("\ufeffgood\n".encode("utf-16-le"),), daemon=True)
    writer.start()
    with pytest.raises(InputError, match="UTF-16 input"):
        read_input(str(pipe), "text")
    writer.join(timeout=10)
