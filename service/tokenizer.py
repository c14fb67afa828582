"""The tokenize stage: Hugging Face's Rust tokenizer, batch encoding, truncation, numpy out."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from service.errors import ModelLoadError
from service.types import TokenBatch

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class TextTokenizer:
    """texts -> TokenBatch (ids [n, longest] int64 right-padded, lengths [n], truncated [n]).

    Truncation keeps the first `max_length - 2` word pieces plus [CLS] and [SEP]. Padding is done here
    in numpy, not by the tokenizer (some tokenizer.json files pad every text to a fixed 128).
    """

    def __init__(self, tokenizer: Tokenizer, max_length: int, model_max_length: int) -> None:
        if max_length > model_max_length:
            max_length = model_max_length  # never above what the position embeddings cover
        if max_length < 2:
            raise ValueError("max_length must leave room for [CLS] and [SEP]")
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length)
        self._tokenizer = tokenizer
        self.max_length = max_length
        pad = tokenizer.token_to_id("[PAD]")
        self.pad_id = 0 if pad is None else pad

    @classmethod
    def from_file(cls, path: str | Path, max_length: int, model_max_length: int) -> TextTokenizer:
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises a plain Exception for every parse error
            raise ModelLoadError(f"{path} is not a readable tokenizer.json: {exc}") from None
        return cls(tokenizer, max_length, model_max_length)

    def encode(self, texts: Sequence[str]) -> TokenBatch:
        if len(texts) == 1:  # most requests: skip the batch bookkeeping (a fifth of tokenizing one text)
            encoding = self._encode_one(texts[0])
            ids = np.array([encoding.ids], dtype=np.int64)  # [1, length]
            return TokenBatch(ids=ids, lengths=np.array([ids.shape[1]], dtype=np.int64),
                              truncated=np.array([bool(encoding.overflowing)], dtype=np.bool_))
        try:
            encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        except TypeError:
            encodings = self._tokenizer.encode_batch([_scalar_values(t) for t in texts], add_special_tokens=True)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        width = int(lengths.max()) if len(encodings) else 0
        ids = np.full((len(encodings), width), self.pad_id, dtype=np.int64)  # [n, width]
        for row, encoding in enumerate(encodings):
            ids[row, : lengths[row]] = encoding.ids
        truncated = np.fromiter((bool(e.overflowing) for e in encodings), dtype=np.bool_, count=len(encodings))
        return TokenBatch(ids=ids, lengths=lengths, truncated=truncated)

    def _encode_one(self, text: str) -> Encoding:
        try:
            return self._tokenizer.encode(text, add_special_tokens=True)
        except TypeError:
            return self._tokenizer.encode(_scalar_values(text), add_special_tokens=True)


def _scalar_values(text: object) -> object:
    """A Python str may hold lone surrogates (json.loads lets "\\ud800" through); they are not Unicode scalar
    values and the Rust side refuses them. Replace them as a UTF-8 decoder would."""
    return _LONE_SURROGATE.sub("\ufffd", text) if isinstance(text, str) else text
