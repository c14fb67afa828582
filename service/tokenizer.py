"""The tokenize stage: Hugging Face's Rust tokenizer, batch encoding of texts and text pairs, truncation, numpy out."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from service.errors import InvalidRequestError, ModelLoadError, PairsUnsupportedError
from service.types import TokenBatch

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

Pairs = Sequence[str | None]  # the second text of each input, None where the input is a single text

# What the event loop may tokenize itself. Beyond this, callers hand the texts to a worker thread, where encode_batch
# releases the GIL while it works (encode does not). WordPiece took ~0.4 µs a character on the default model's
# tokenizer (2026-12-03, AMD EPYC): 4096 characters hold the loop for ~1.5 ms, a 4 MB text for seconds.
INLINE_TEXTS = 16
INLINE_CHARS = 4096


def tokenize_inline(texts: Sequence[str], pairs: Pairs | None = None) -> bool:
    """Whether `texts` (and their second texts) are small enough to tokenize on the event loop."""
    if len(texts) > INLINE_TEXTS:
        return False
    chars = sum(map(len, texts))
    if pairs is not None:
        chars += sum(len(p) for p in pairs if p is not None)
    return chars <= INLINE_CHARS


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """One token as `POST /tokenize` shows it: start/stop are character offsets into its text (None for specials)."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


def _clean(text: str) -> str:
    # A Python str may hold lone surrogates (json.loads lets "\\ud800" through); they are not Unicode scalar values
    # and the Rust side refuses the whole batch. Replace them as a UTF-8 decoder would.
    return _LONE_SURROGATE.sub("\ufffd", text)


class TextTokenizer:
    """texts (and optional second texts) -> TokenBatch (ids [n, longest] int64 right-padded, lengths [n],
    truncated [n], and type_ids [n, longest] when the model reads token types and some input is a pair).

    Truncation keeps at most `max_length` tokens, special tokens included; for a pair the longer text loses tokens
    first. Padding is done here in numpy, not by the tokenizer (some tokenizer.json files pad every text to a
    fixed 128), with the model's pad id.
    """

    def __init__(self, tokenizer: Tokenizer, max_length: int, model_max_length: int, *, pad_id: int | None = None,
                 token_types: bool = False) -> None:
        if max_length > model_max_length:
            max_length = model_max_length  # never above what the position embeddings cover
        if max_length < 2:
            raise ValueError("max_length must leave room for [CLS] and [SEP]")
        tokenizer.no_padding()
        # Used untruncated by /tokenize, which shows a text's every token; a copy, so the settings stay apart.
        self._untruncated = Tokenizer.from_str(tokenizer.to_str())
        self._untruncated.no_truncation()
        tokenizer.enable_truncation(max_length)
        self._tokenizer = tokenizer
        self.max_length = max_length
        if pad_id is None:
            pad = tokenizer.token_to_id("[PAD]")
            pad_id = 0 if pad is None else pad
        self.pad_id = pad_id
        self.token_types = token_types
        self.pairs = self._pairs_work()

    @classmethod
    def from_file(cls, path: str | Path, max_length: int, model_max_length: int, *, pad_id: int | None = None,
                  token_types: bool = False) -> TextTokenizer:
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises a plain Exception for every parse error
            raise ModelLoadError(f"{path} is not a readable tokenizer.json: {exc}") from None
        return cls(tokenizer, max_length, model_max_length, pad_id=pad_id, token_types=token_types)

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def _pairs_work(self) -> bool:
        """Whether this tokenizer.json knows how to join two texts: its post-processor marks a pair with at least
        the special tokens it puts around one text. (A template without a pair rule would glue them together.)"""
        try:
            single = self._untruncated.encode("a").special_tokens_mask
            pair = self._untruncated.encode("a", "b").special_tokens_mask
        except Exception:  # the Rust side raises a plain Exception
            return False
        return sum(pair) >= max(1, sum(single))

    def encode(self, texts: Sequence[str], pairs: Pairs | None = None) -> TokenBatch:
        if len(texts) == 1 and (pairs is None or pairs[0] is None) and len(texts[0]) <= INLINE_CHARS:
            return self._encode_one(texts[0])  # a longer one goes through encode_batch, which releases the GIL
        inputs: list[str | tuple[str, str]] = list(texts)
        if pairs is not None and any(p is not None for p in pairs):
            if not self.pairs:
                raise PairsUnsupportedError(
                    "this model's tokenizer.json has no rule for joining two texts (its post-processor has no pair "
                    "template), so text pairs cannot be classified; send single texts"
                )
            inputs = [t if p is None else (t, p) for t, p in zip(texts, pairs, strict=True)]
        try:
            encodings = self._tokenizer.encode_batch(inputs, add_special_tokens=True)
        except TypeError:
            cleaned = [(_clean(i[0]), _clean(i[1])) if isinstance(i, tuple) else _clean(i) for i in inputs]
            encodings = self._tokenizer.encode_batch(cleaned, add_special_tokens=True)
        return self._batch(encodings, typed=self.token_types and any(isinstance(i, tuple) for i in inputs))

    def _encode_one(self, text: str) -> TokenBatch:
        """Most requests hold one text: encoded alone, without the batch bookkeeping (a fifth of the cost)."""
        try:
            encoding = self._tokenizer.encode(text, add_special_tokens=True)
        except TypeError:
            encoding = self._tokenizer.encode(_clean(text), add_special_tokens=True)
        ids = np.array([encoding.ids], dtype=np.int64)  # [1, length]
        return TokenBatch(ids=ids, lengths=np.array([ids.shape[1]], dtype=np.int64),
                          truncated=np.array([bool(encoding.overflowing)], dtype=np.bool_))

    def _batch(self, encodings: list[Encoding], typed: bool) -> TokenBatch:
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        width = int(lengths.max()) if len(encodings) else 0
        ids = np.full((len(encodings), width), self.pad_id, dtype=np.int64)  # [n, width]
        types = np.zeros((len(encodings), width), dtype=np.int64) if typed else None  # [n, width]
        for row, encoding in enumerate(encodings):
            ids[row, : lengths[row]] = encoding.ids
            if types is not None:
                types[row, : lengths[row]] = encoding.type_ids
        truncated = np.fromiter((bool(e.overflowing) for e in encodings), dtype=np.bool_, count=len(encodings))
        return TokenBatch(ids=ids, lengths=lengths, truncated=truncated, type_ids=types)

    def tokens(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[TokenInfo]]:
        """Every token of each text, untruncated, with its character span (for `POST /tokenize`)."""
        cleaned = [_clean(t) for t in texts]
        encodings = self._untruncated.encode_batch(cleaned, add_special_tokens=add_special_tokens)
        return [
            [
                TokenInfo(i, token, True, None, None) if special else TokenInfo(i, text[start:stop], False, start, stop)
                for i, token, special, (start, stop) in zip(
                    e.ids, e.tokens, e.special_tokens_mask, e.offsets, strict=True)
            ]
            for text, e in zip(cleaned, encodings, strict=True)
        ]

    def decode(self, ids: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        """Token ids back to text (for `POST /decode`); an id outside the vocabulary is refused, not dropped."""
        size = self.vocab_size
        for row, sequence in enumerate(ids):
            for token in sequence:
                if not 0 <= token < size:
                    raise InvalidRequestError(f"ids[{row}] holds {token}, outside this tokenizer's ids 0..{size - 1}")
        return list(self._tokenizer.decode_batch([list(s) for s in ids], skip_special_tokens=skip_special_tokens))
