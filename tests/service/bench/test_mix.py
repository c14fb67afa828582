from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from glassbox.service.bench.mix import make_batches, read_mix
from glassbox.service.errors import InvalidRequestError
from glassbox.service.tokenizer import TextTokenizer
from tests.helpers import tiny_tokenizer_json

LABELS = ("negative", "positive")


def _tokenizer() -> TextTokenizer:
    return TextTokenizer(Tokenizer.from_str(tiny_tokenizer_json()), 64, 128)


def test_jsonl_labels_may_be_names_or_indices(tmp_path: Path) -> None:
    path = tmp_path / "mix.jsonl"
    path.write_text('{"text": "good", "label": "positive"}\n\n{"text": "bad", "label": 0}\n')
    mix = read_mix(path, LABELS)
    assert mix.texts == ("good", "bad")
    assert mix.labels is not None and mix.labels.tolist() == [1, 0]


def test_plain_lines_and_partly_labelled_files_have_no_labels(tmp_path: Path) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("good movie\nbad movie\n")
    assert read_mix(plain, LABELS).labels is None
    partial = tmp_path / "partial.jsonl"
    partial.write_text('{"text": "good", "label": "positive"}\n{"text": "bad"}\n')
    assert read_mix(partial, LABELS).labels is None


@pytest.mark.parametrize("content, message", [
    ('{"text": "x", "label": "neutral"}\n', "not one of the model's labels"),
    ('{"text": "x", "label": 5}\n', "not one of the model's labels"),
    ('{"label": 1}\n', "needs a string field 'text'"),
    ("{broken\n", "not valid JSON"),
    ("\n\n", "holds no texts"),
])
def test_bad_mix_files_are_named(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "mix.jsonl"
    path.write_text(content)
    with pytest.raises(InvalidRequestError, match=message):
        read_mix(path, LABELS)


def test_a_binary_mix_file_is_named_not_a_decode_error(tmp_path: Path) -> None:
    # read_text raises UnicodeDecodeError, a ValueError the bench's usage-error handler did not catch
    path = tmp_path / "garbage.bin"
    path.write_bytes(b"\xff\xfe\x00" + bytes(range(256)))
    with pytest.raises(InvalidRequestError, match=r"garbage\.bin is not UTF-8 text"):
        read_mix(path, LABELS)


def _mix_file(tmp_path: Path, count: int = 23) -> Path:
    path = tmp_path / "mix.jsonl"
    rng = np.random.default_rng(0)
    lines = [json.dumps({"text": " ".join(["movie"] * int(rng.integers(1, 30))), "label": i % 2}) for i in range(count)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_sorted_batches_cover_every_text_once_in_length_order(tmp_path: Path) -> None:
    batches = make_batches(_tokenizer(), read_mix(_mix_file(tmp_path), LABELS), batch_size=5, sort=True)
    assert [b.size for b in batches.batches] == [5, 5, 5, 5, 3]
    assert sorted(np.concatenate(batches.rows).tolist()) == list(range(23))
    widths = [b.max_length for b in batches.batches]
    assert widths == sorted(widths)
    assert all(b.ids.shape == (b.size, b.max_length) for b in batches.batches)


def test_unsorted_batches_keep_file_order(tmp_path: Path) -> None:
    batches = make_batches(_tokenizer(), read_mix(_mix_file(tmp_path), LABELS), batch_size=5, sort=False)
    assert np.concatenate(batches.rows).tolist() == list(range(23))
    assert not batches.sorted and batches.texts == 23
