"""The benchmark's text mix: real snippets with their labels, tokenized once and cut into batches."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from glassbox.service.errors import InvalidRequestError
from glassbox.service.tokenizer import TextTokenizer
from glassbox.service.types import IntArray, TokenBatch


@dataclass(frozen=True, slots=True)
class TextMix:
    texts: tuple[str, ...]
    labels: IntArray | None  # [n] label index per text, None when the file carries no labels
    source: str


@dataclass(frozen=True, slots=True)
class Batches:
    """The mix cut into engine batches; `rows[i]` says which texts `batches[i]` holds."""

    batches: tuple[TokenBatch, ...]
    rows: tuple[IntArray, ...]
    sorted: bool

    @property
    def texts(self) -> int:
        return sum(b.size for b in self.batches)


def _label_index(raw: object, labels: Sequence[str], where: str) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < len(labels):
        return raw
    if isinstance(raw, str) and raw in labels:
        return labels.index(raw)
    raise InvalidRequestError(f"{where}: label {raw!r} is not one of the model's labels {list(labels)}")


def read_mix(path: Path, labels: Sequence[str]) -> TextMix:
    """JSON lines of {"text", "label"} (label: a name or an index), or plain text, one snippet a line.

    Labels count only when every line has one; a mix with some unlabelled lines reports no accuracy.
    """
    texts: list[str] = []
    found: list[int | None] = []
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # a ValueError, not an OSError: a binary file given by mistake
        raise InvalidRequestError(f"{path} is not UTF-8 text (a mix is JSON lines or plain lines)") from None
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise InvalidRequestError(f"{path}:{number} is not valid JSON: {exc}") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise InvalidRequestError(f"{path}:{number} needs a string field 'text'")
            texts.append(record["text"])
            raw = record.get("label")
            found.append(None if raw is None else _label_index(raw, labels, f"{path}:{number}"))
        else:
            texts.append(line)
            found.append(None)
    if not texts:
        raise InvalidRequestError(f"{path} holds no texts")
    known = [label for label in found if label is not None]
    indices = np.array(known, dtype=np.int64) if len(known) == len(found) else None
    return TextMix(texts=tuple(texts), labels=indices, source=str(path))


# Words of several scripts and lengths, so every tokenizer (WordPiece, byte-level BPE, SentencePiece) splits them
# into a realistic mix of whole words and pieces.
_SYNTHETIC_TEXT = (
    "the a film movie was very good bad not slow fast story plot acting actor music scene ending cast director "
    "funny sad long short boring great awful best worst love hate beautiful tedious charming predictable "
    "unforgettable overlong surprisingly heartfelt performance screenplay cinematography "
    "le film était très bien une histoire longue café déjà naïve der Film war sehr gut el final fue malo "
    "muy bueno 映画 良い مرحبا 😀 2024 12.5 don't isn't"
)
_SYNTHETIC_WORDS = _SYNTHETIC_TEXT.split()


def synthetic_mix(count: int = 256, seed: int = 0) -> TextMix:
    """Unlabelled texts of 3 to ~150 words (log-uniform lengths, like review snippets and short posts), for models
    that come without a held-out file: speed can be measured on any model; accuracy cannot."""
    rng = np.random.default_rng(seed)
    lengths = np.exp(rng.uniform(np.log(3), np.log(150), size=count)).astype(np.int64)
    texts = tuple(" ".join(_SYNTHETIC_WORDS[int(i)] for i in rng.integers(0, len(_SYNTHETIC_WORDS), size=int(n)))
                  for n in lengths)
    return TextMix(texts=texts, labels=None, source=f"synthetic ({count} texts, seed {seed})")


def make_batches(tokenizer: TextTokenizer, mix: TextMix, batch_size: int, sort: bool) -> Batches:
    """Length-sorted batches (what a bucketing batcher produces) or batches in file order (what a
    first-come batcher produces); each batch is padded only to its own longest text."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    tokens = tokenizer.encode(mix.texts)  # [n, longest]
    order = np.argsort(tokens.lengths, kind="stable") if sort else np.arange(tokens.size)
    rows = tuple(order[start:start + batch_size] for start in range(0, tokens.size, batch_size))
    return Batches(batches=tuple(tokens.select(r) for r in rows), rows=rows, sorted=sort)
