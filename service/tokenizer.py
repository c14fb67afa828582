"""The tokenize stage: Hugging Face's Rust tokenizer, batch encoding of texts and text pairs, truncation, numpy out."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from glassbox.service.errors import InvalidRequestError, ModelLoadError, PairsUnsupportedError, TextTooLongError
from glassbox.service.types import TokenBatch

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

Pairs = Sequence[str | None]  # the second text of each input, None where the input is a single text

# What the event loop may tokenize itself. Beyond this, callers hand the texts to a worker thread, where a batch call
# releases the GIL while it works (encode does not, which suits one short text on the loop: releasing the GIL there
# would let an engine thread take it, and the loop would wait to get it back). Batches go through encode_batch_fast:
# the same ids, type ids and truncation, without the character offsets nothing here reads (14-18% less time than
# encode_batch in batches of 8 and 32 of the mix, 2026-12-03). WordPiece took ~0.4 µs a character on the default
# model's tokenizer (2026-12-03, AMD EPYC): 4096 characters hold the loop for ~1.5 ms, a 4 MB text for seconds.
INLINE_TEXTS = 16
INLINE_CHARS = 4096

# How much of a long text is read at a time while finding where its kept tokens end. The Rust tokenizer builds every
# token of what it is given before truncating (~500 bytes a token, ~60 a character: a 4 MB body of "." took 2.2 GB
# and 8 s to keep 256 tokens), so a text longer than this is handed to it only as far as its first max_length tokens
# reach, cut where a word ends.
READ_CHARS = 4096
# Where a long text may be cut: just before an ASCII space, tab or line break that follows a character that is not
# whitespace. Every supported pre-tokenizer (BERT's whitespace and punctuation split, byte-level BPE's, Metaspace)
# ends a word there and starts the next one with that whitespace, so the tokens before such a cut are the same
# whether or not the rest of the text follows.
_WORD_END = re.compile(r"(?<=\S)[ \t\n\r]")


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


class _Reading:
    """A text tokenized a piece at a time, each piece ending where a word does: how far it was read (`part`) and how
    many tokens that holds. Pieces go through encode_batch, which releases the GIL (this runs in a worker thread
    beside the event loop), and each is dropped once counted."""

    def __init__(self, tokenizer: Tokenizer, text: str, chars: int = READ_CHARS) -> None:
        self._tokenizer = tokenizer
        self._text = text
        self._chars = chars
        self._end = 0
        self.tokens = 0

    @property
    def whole(self) -> bool:
        return self._end >= len(self._text)

    @property
    def part(self) -> str:
        return self._text if self.whole else self._text[: self._end]

    def step(self) -> None:
        start, text = self._end, self._text
        end = _word_end(text, start + self._chars)
        (piece,) = self._tokenizer.encode_batch([_clean(text[start:end])], add_special_tokens=False)
        tokens = len(piece)
        if end < len(text) and _WORD_END.match(text, end) is None:
            # Cut where no ASCII whitespace was near (words apart by NBSP, U+3000 or U+2028 only; long runs between
            # punctuation): the cut may split a word, whose halves tokenize apart to other tokens, and other counts,
            # than the word does. Cut where the tokenizer's own last word of the piece starts instead, and count
            # only the words before it, unless that word is all of the piece (one word over READ_CHARS long).
            words = piece.word_ids
            first = words.index(words[-1]) if words else 0
            back = start + piece.offsets[first][0] if first else start
            if back > start:
                tokens, end = first, back
        self.tokens += tokens
        self._end = end

    def past(self, tokens: int) -> _Reading:
        """Read on until more than `tokens` tokens are read, or all of the text."""
        while not self.whole and self.tokens <= tokens:
            self.step()
        return self


def _word_end(text: str, at: int) -> int:
    """The first place at or after `at` where `text` may be cut (_WORD_END), looking READ_CHARS further at most;
    `at` itself when there is none; the text's length when `at` is past it."""
    if at >= len(text):
        return len(text)
    found = _WORD_END.search(text, at, at + READ_CHARS)
    return found.start() if found is not None else at


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
            return self._encode_one(texts[0])  # a longer one goes through encode_batch_fast, which releases the GIL
        paired = pairs is not None and any(p is not None for p in pairs)
        if paired and not self.pairs:
            raise PairsUnsupportedError(
                "this model's tokenizer.json has no rule for joining two texts (its post-processor has no pair "
                "template), so text pairs cannot be classified; send single texts"
            )
        inputs: list[str | tuple[str, str]]
        cut: list[bool] = []
        if not paired and max(map(len, texts), default=0) <= READ_CHARS:
            inputs = list(texts)  # the usual request: every text goes whole (reach would return each as it is)
        else:  # only as much of each text as its kept tokens need reaches the tokenizer (see reach)
            seconds: Pairs = pairs if pairs is not None and paired else [None] * len(texts)
            reached = [self.reach_pair(text, second) for text, second in zip(texts, seconds, strict=True)]
            cut = [len(part) < len(text) or len(part2 or "") < len(second or "")
                   for (part, part2), text, second in zip(reached, texts, seconds, strict=True)]
            inputs = [part if part2 is None else (part, part2) for part, part2 in reached]
        try:
            encodings = self._tokenizer.encode_batch_fast(inputs, add_special_tokens=True)
        except TypeError:
            cleaned = [(_clean(i[0]), _clean(i[1])) if isinstance(i, tuple) else _clean(i) for i in inputs]
            encodings = self._tokenizer.encode_batch_fast(cleaned, add_special_tokens=True)
        batch = self._batch(encodings, typed=self.token_types and any(isinstance(i, tuple) for i in inputs))
        if any(cut):  # a text cut short holds more tokens than were kept, whatever its kept part alone says
            batch.truncated[np.array(cut)] = True
        return batch

    def reach(self, text: str) -> str:
        """The start of `text` that holds more than max_length tokens, cut where a word ends (_WORD_END); the whole
        text when it is shorter. Its tokens are the first tokens of the whole text and it overflows max_length as
        the whole text does, so it encodes to the same truncated ids. Read READ_CHARS at a time, so a long text costs
        the tokenizer about as much as its kept tokens do. A text with no ASCII whitespace for READ_CHARS characters is
        cut where the tokenizer's last word of the piece starts (see _Reading.step), and inside a word only when one
        word is longer than that: a made-up input (one 4 MB "word"), for which bounded memory matters more than
        exact last tokens."""
        if len(text) <= READ_CHARS:
            return text
        return _Reading(self._untruncated, text).past(self.max_length).part

    def reach_pair(self, text: str, pair: str | None) -> tuple[str, str | None]:
        """reach() for a text and its second text. Truncation (longest first) gives the odd one of the tokens left
        after the specials to the longer text, so the two parts must compare as the whole texts do (a tie counts the
        first text as the shorter): the one that is longer is read on past the other's part."""
        # Both texts of a pair are read in small pieces: the Rust tokenizer truncates a pair into every combination
        # of the two texts' overflow pieces, so what reaches it must stay near max_length tokens a text when both are
        # long (at max_length 256 a pair of two 4096-character texts of punctuation took 170 MB, and a body of 256
        # such pairs would take 40 GB). With one text short the overflow pieces grow with the other's length only.
        chars = min(READ_CHARS, max(64, 2 * self.max_length))
        if pair is None or (max(len(text), len(pair)) <= READ_CHARS and min(len(text), len(pair)) <= chars):
            return (self.reach(text) if pair is None else text), pair
        first = _Reading(self._untruncated, text, chars).past(self.max_length)
        second = _Reading(self._untruncated, pair, chars).past(self.max_length)
        if first.whole and second.whole:
            return text, pair
        if self._first_longer(text, pair):
            first.past(second.tokens)
        else:
            second.past(first.tokens - 1)
        return first.part, second.part

    def _first_longer(self, text: str, pair: str) -> bool:
        """Whether `text` holds more tokens than `pair`: both are read a piece at a time, the one behind first, until
        the shorter is whole and the other is past it (time as for tokenizing the shorter twice, memory a piece's)."""
        first, second = _Reading(self._untruncated, text), _Reading(self._untruncated, pair)
        while not (first.whole or second.whole):
            (first if first.tokens <= second.tokens else second).step()
        if first.whole:
            second.past(first.tokens - 1)
        else:
            first.past(second.tokens)
        return first.tokens > second.tokens

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

    def tokens(self, texts: Sequence[str], add_special_tokens: bool = True, *,
               most: int | None = None) -> list[list[TokenInfo]]:
        """Every token of each text, untruncated, with its character span (for `POST /tokenize`). With `most`, texts
        holding more tokens than that in all are refused (TextTooLongError) after counting a piece at a time: listed,
        a token costs ~500 bytes in the Rust tokenizer and as many again in Python, and ~70 bytes of JSON, so a 4 MB
        body of one-letter words grew the process by 1.1 GB for a 139 MB answer."""
        # Counted only when the texts could hold more: no token covers less than a byte of its text, beside the few
        # special ones, so the usual request is tokenized once, not counted first.
        if most is not None and sum(4 * len(text) + 4 for text in texts) > most:
            counted = 0
            for text in texts:
                counted += _Reading(self._untruncated, text).past(most - counted).tokens
                if counted > most:
                    raise TextTooLongError(f"the inputs hold more than {most} tokens, the most /tokenize lists in "
                                           "one answer (--max-texts-per-request x --max-length); send fewer or "
                                           "shorter texts")
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

    def decode(self, ids: Sequence[Sequence[int]], skip_special_tokens: bool = True, *,
               most: int | None = None) -> list[str]:
        """Token ids back to text (for `POST /decode`); an id outside the vocabulary is refused, not dropped, and with
        `most`, more ids than that in all."""
        if most is not None and (total := sum(map(len, ids))) > most:
            raise TextTooLongError(f"{total} ids in one request; /decode takes at most {most} "
                                   "(--max-texts-per-request x --max-length)")
        size = self.vocab_size
        for row, sequence in enumerate(ids):
            for token in sequence:
                if not 0 <= token < size:
                    raise InvalidRequestError(f"ids[{row}] holds {token}, outside this tokenizer's ids 0..{size - 1}")
        return list(self._tokenizer.decode_batch([list(s) for s in ids], skip_special_tokens=skip_special_tokens))
