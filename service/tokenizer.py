"""The tokenize stage: Hugging Face's Rust tokenizer, batch encoding, truncation, numpy out."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

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
        try:
            encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        except TypeError:
            # A Python str may hold lone surrogates (json.loads lets "\\ud800" through); they are not Unicode
            # scalar values and the Rust side refuses the whole batch. Replace them as a UTF-8 decoder would.
            cleaned = [_LONE_SURROGATE.sub("\ufffd", t) if isinstance(t, str) else t for t in texts]
            encodings = self._tokenizer.encode_batch(cleaned, add_special_tokens=True)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        width = int(lengths.max()) if len(encodings) else 0
        ids = np.full((len(encodings), width), self.pad_id, dtype=np.int64)  # [n, width]
        for row, encoding in enumerate(encodings):
            ids[row, : lengths[row]] = encoding.ids
        truncated = np.fromiter((bool(e.overflowing) for e in encodings), dtype=np.bool_, count=len(encodings))
        return TokenBatch(ids=ids, lengths=lengths, truncated=truncated)
