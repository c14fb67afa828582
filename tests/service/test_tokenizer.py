"""The tokenize stage on a real (tiny) WordPiece tokenizer: odd text, truncation, padding, dtypes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, processors

from glassbox.service.errors import InvalidRequestError, ModelLoadError, PairsUnsupportedError, status_for
from glassbox.service.tokenizer import INLINE_CHARS, INLINE_TEXTS, READ_CHARS, TextTokenizer, tokenize_inline
from tests.families import tokenizer_json
from tests.helpers import tiny_tokenizer_json

VOCAB = Tokenizer.from_str(tiny_tokenizer_json()).get_vocab()
CLS, SEP, PAD, UNK = VOCAB["[CLS]"], VOCAB["[SEP]"], VOCAB["[PAD]"], VOCAB["[UNK]"]


def make(max_length: int = 16, model_max_length: int = 128) -> TextTokenizer:
    return TextTokenizer(Tokenizer.from_str(tiny_tokenizer_json()), max_length, model_max_length)


def only(tokenizer: TextTokenizer, text: str) -> list[int]:
    batch = tokenizer.encode([text])
    return [int(i) for i in batch.ids[0, : batch.lengths[0]]]


def test_plain_text_gets_cls_and_sep() -> None:
    assert only(make(), "good movie") == [CLS, VOCAB["good"], VOCAB["movie"], SEP]


def test_empty_and_whitespace_text_is_just_the_special_tokens() -> None:
    batch = make().encode(["", "   \t\n"])
    assert batch.lengths.tolist() == [2, 2]
    assert batch.ids.tolist() == [[CLS, SEP], [CLS, SEP]]
    assert not batch.truncated.any()


def test_combining_mark_is_folded_like_the_precomposed_letter() -> None:
    # BertNormalizer strips accents: "e" + U+0301 and U+00E9 both become "e".
    tokenizer = make()
    assert only(tokenizer, "e\u0301") == only(tokenizer, "\u00e9") == [CLS, VOCAB["e"], SEP]


def test_emoji_becomes_unknown_without_breaking_its_neighbours() -> None:
    assert only(make(), "good 😀 film") == [CLS, VOCAB["good"], UNK, VOCAB["film"], SEP]
    # A family emoji is several code points joined by U+200D; it stays one unknown word, not several rows.
    assert only(make(), "👨\u200d👩\u200d👧") == [CLS, UNK, SEP]


@pytest.mark.parametrize("text", ["مرحبا بالعالم", "שלום עולם", "good \u202bمرحبا\u202c movie"])
def test_right_to_left_text(text: str) -> None:
    ids = only(make(), text)
    assert ids[0] == CLS and ids[-1] == SEP
    assert 3 <= len(ids) <= 6
    if "good" in text:  # the Latin words around the embedded RTL run survive, in logical order
        assert ids[1] == VOCAB["good"] and ids[-2] == VOCAB["movie"]


def test_lone_surrogates_do_not_break_the_batch() -> None:
    # json.loads('"\\ud800"') produces such a str; the Rust tokenizer refuses it unless it is cleaned first.
    batch = make().encode(["good \ud800 movie", "fun"])
    assert batch.lengths.tolist() == [4, 3]
    assert batch.ids[0, :4].tolist() == [CLS, VOCAB["good"], VOCAB["movie"], SEP]


def test_very_long_text_is_truncated_with_sep_last() -> None:
    tokenizer = make(max_length=16)
    batch = tokenizer.encode(["good " * 1000, "good " * 14, "good " * 15])
    assert batch.lengths.tolist() == [16, 16, 16]
    assert batch.truncated.tolist() == [True, False, True]  # 14 words + 2 specials fit exactly; 15 do not
    for row in range(3):
        assert batch.ids[row, 0] == CLS and batch.ids[row, 15] == SEP
        assert (batch.ids[row, 1:15] == VOCAB["good"]).all()


class _Spy:
    """Stands in for the Rust tokenizer inside a TextTokenizer and notes which of its calls each encode made."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer, self.calls = tokenizer, list[str]()

    def encode(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append("encode")
        return self.tokenizer.encode(*args, **kwargs)

    def encode_batch_fast(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append("encode_batch_fast")
        return self.tokenizer.encode_batch_fast(*args, **kwargs)


def test_a_single_long_text_goes_through_a_batch_call_which_releases_the_gil() -> None:
    tokenizer = make(max_length=16)
    spy = _Spy(tokenizer._tokenizer)
    tokenizer._tokenizer = spy  # type: ignore[assignment]
    long_text = "good " * (INLINE_CHARS // 5 + 1)
    assert tokenize_inline(["good " * (INLINE_CHARS // 5)]) and not tokenize_inline([long_text])
    short, long = tokenizer.encode(["good " * (INLINE_CHARS // 5)]), tokenizer.encode([long_text])
    assert spy.calls == ["encode", "encode_batch_fast"]
    assert long.ids.tolist() == short.ids.tolist() and long.truncated.tolist() == [True]
    assert not tokenize_inline(["a"] * (INLINE_TEXTS + 1)) and not tokenize_inline(["a"], ["b" * INLINE_CHARS])


def test_max_length_is_capped_at_the_model_limit() -> None:
    tokenizer = make(max_length=4096, model_max_length=32)
    assert tokenizer.max_length == 32
    batch = tokenizer.encode(["good " * 100])
    assert batch.lengths.tolist() == [32] and batch.truncated.tolist() == [True]
    assert make(max_length=8, model_max_length=32).max_length == 8


def test_max_length_must_leave_room_for_the_specials() -> None:
    with pytest.raises(ValueError):
        make(max_length=1)


def test_mixed_lengths_are_right_padded_with_the_pad_id() -> None:
    tokenizer = make()
    texts = ["good", "", "the plot very very slow", "fun fun"]
    batch = tokenizer.encode(texts)
    assert tokenizer.pad_id == PAD
    assert batch.lengths.tolist() == [3, 2, 7, 4]
    assert batch.ids.shape == (4, 7)
    assert batch.size == 4 and batch.max_length == 7 and batch.real_tokens == 16
    for row, text in enumerate(texts):
        length = batch.lengths[row]
        assert batch.ids[row, :length].tolist() == only(tokenizer, text)  # same ids as when encoded alone
        assert (batch.ids[row, length:] == PAD).all()


def test_numpy_dtypes_and_shapes() -> None:
    batch = make().encode(["good", "bad movie"])
    assert batch.ids.dtype == np.int64 and batch.lengths.dtype == np.int64 and batch.truncated.dtype == np.bool_
    assert batch.ids.shape == (2, 4) and batch.lengths.shape == (2,) and batch.truncated.shape == (2,)
    assert batch.ids.flags.c_contiguous


def test_empty_batch() -> None:
    batch = make().encode([])
    assert batch.size == 0 and batch.ids.shape == (0, 0) and batch.max_length == 0


def test_padding_configured_in_the_file_is_ignored(tmp_path: Path) -> None:
    raw = Tokenizer.from_str(tiny_tokenizer_json())
    raw.enable_padding(pad_id=PAD, pad_token="[PAD]", length=64)
    path = tmp_path / "tokenizer.json"
    raw.save(str(path))
    batch = TextTokenizer.from_file(path, 16, 128).encode(["good", "bad movie"])
    assert batch.lengths.tolist() == [3, 4] and batch.ids.shape == (2, 4)


def test_from_file_reports_a_broken_file(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text("{broken", encoding="utf-8")
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json"):
        TextTokenizer.from_file(path, 16, 128)
    with pytest.raises(ModelLoadError, match=r"missing\.json"):
        TextTokenizer.from_file(tmp_path / "missing.json", 16, 128)


# Any code point, lone surrogates included (hypothesis leaves those out unless asked).
any_char = st.one_of(st.characters(), st.characters(categories=["Cs"]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(any_char, max_size=300), min_size=1, max_size=6), st.integers(2, 40))
def test_any_unicode_text_encodes_within_bounds(texts: list[str], max_length: int) -> None:
    tokenizer = make(max_length=max_length)
    batch = tokenizer.encode(texts)
    assert batch.size == len(texts)
    assert ((batch.lengths >= 2) & (batch.lengths <= max_length)).all()
    assert batch.ids.shape == (len(texts), int(batch.lengths.max()))
    assert ((batch.ids >= 0) & (batch.ids < len(VOCAB))).all()
    for row in range(batch.size):
        length = batch.lengths[row]
        assert batch.ids[row, 0] == CLS and batch.ids[row, length - 1] == SEP
        assert (batch.ids[row, length:] == PAD).all()
        assert batch.truncated[row] == (length == max_length and len(only(make(10_000), texts[row])) > max_length)


def test_pairs_get_token_types_only_for_models_that_read_them() -> None:
    typed = TextTokenizer(Tokenizer.from_str(tiny_tokenizer_json()), 16, 128, token_types=True)
    batch = typed.encode(["good movie", "bad"], ["boring", None])
    assert batch.ids.tolist() == [[CLS, VOCAB["good"], VOCAB["movie"], SEP, VOCAB["boring"], SEP],
                                  [CLS, VOCAB["bad"], SEP, PAD, PAD, PAD]]
    assert batch.type_ids is not None and batch.type_ids.tolist() == [[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0]]
    assert typed.encode(["good movie"], [None]).type_ids is None  # no pair: every type id would be 0
    untyped = make().encode(["good movie"], ["boring"])
    assert untyped.type_ids is None and untyped.lengths.tolist() == [6]


def test_a_pair_is_truncated_longest_first_to_max_length() -> None:
    batch = make(max_length=8).encode(["good " * 10], ["bad"])
    ids = batch.ids[0].tolist()
    assert len(ids) == 8 and bool(batch.truncated[0])
    assert ids[-3:] == [SEP, VOCAB["bad"], SEP]  # the short second text survives whole


class _ShortInputsOnly:
    """Stands in for a Rust tokenizer and refuses any text longer than `limit`, before the real one would spend
    gigabytes on it."""

    def __init__(self, tokenizer: Tokenizer, limit: int) -> None:
        self.tokenizer, self.limit = tokenizer, limit

    def _check(self, inputs: list[Any]) -> None:
        for item in inputs:
            longest = max(len(text) for text in (item if isinstance(item, tuple) else (item,)))
            assert longest <= self.limit, f"a {longest}-character text reached the Rust tokenizer"

    def encode_batch(self, inputs: list[Any], **kwargs: Any) -> Any:
        self._check(inputs)
        return self.tokenizer.encode_batch(inputs, **kwargs)

    def encode_batch_fast(self, inputs: list[Any], **kwargs: Any) -> Any:
        self._check(inputs)
        return self.tokenizer.encode_batch_fast(inputs, **kwargs)


def _prose(chars: int, seed: int) -> str:
    """Words, punctuation, accents, emoji and CJK, with spaces, tabs, line breaks and wide spaces between them."""
    rng = np.random.default_rng(seed)
    words = ["good", "movie", "bad", "a", "the", "wonderful", "acting!", "plot,", "x" * 120, "h\u00e9llo", "\U0001f600",
             "\u65e5\u672c", "...", "don't", "e\u0301"]
    gaps = [" ", " ", "  ", "\n", "\t", " \u3000 ", ""]
    parts: list[str] = []
    while sum(map(len, parts)) < chars:
        parts += [words[rng.integers(len(words))], gaps[rng.integers(len(gaps))]]
    return "".join(parts)


def test_a_long_text_reaches_the_rust_tokenizer_only_as_far_as_its_kept_tokens() -> None:
    # The Rust tokenizer builds every token of what it is given before it truncates: 4 MB of "." took 2.2 GB and 8 s
    # to keep 256 tokens, and a pair of two 128 KB texts ran it out of memory (its overflow pieces are a product).
    tokenizer = make(max_length=16)
    tokenizer._tokenizer = _ShortInputsOnly(tokenizer._tokenizer, 2 * READ_CHARS)  # type: ignore[assignment]
    tokenizer._untruncated = _ShortInputsOnly(tokenizer._untruncated, 2 * READ_CHARS)  # type: ignore[assignment]
    text = "good " * 200_000  # 1 MB
    batch = tokenizer.encode([text, "." * 1_000_000], [text, None])
    assert batch.truncated.tolist() == [True, True] and batch.lengths.tolist() == [16, 16]
    # 13 tokens left after the specials, split longest first: a tie counts the first text as the shorter
    assert batch.ids[0].tolist() == [CLS, *[VOCAB["good"]] * 6, SEP, *[VOCAB["good"]] * 7, SEP]


class _ShortPairsOnly:
    """Stands in for the truncating Rust tokenizer and refuses a pair whose texts are both longer than `limit`: it
    truncates a pair into every combination of the two texts' overflow pieces."""

    def __init__(self, tokenizer: Tokenizer, limit: int) -> None:
        self.tokenizer, self.limit = tokenizer, limit

    def encode_batch_fast(self, inputs: list[Any], **kwargs: Any) -> Any:
        for item in inputs:
            if isinstance(item, tuple):
                assert min(map(len, item)) <= self.limit, f"a pair of {len(item[0])} and {len(item[1])} characters"
        return self.tokenizer.encode_batch_fast(inputs, **kwargs)


def test_a_pair_of_long_texts_reaches_the_rust_tokenizer_near_max_length_tokens() -> None:
    # Two 4096-character texts of punctuation went whole: at max_length 256 that took 170 MB a pair (the overflow
    # pieces of both texts, combined), and 256 pairs fit in one request.
    tokenizer = make(max_length=16)
    tokenizer._tokenizer = _ShortPairsOnly(tokenizer._tokenizer, 256)  # type: ignore[assignment]
    batch = tokenizer.encode(["." * READ_CHARS, "good movie"], ["," * READ_CHARS, "bad " * 2000])
    assert batch.truncated.tolist() == [True, True]
    # 13 tokens left after the specials, split longest first: a tie counts the first text as the shorter
    assert batch.ids[0].tolist() == [CLS, *[VOCAB["."]] * 6, SEP, *[VOCAB[","]] * 7, SEP]
    assert batch.ids[1].tolist() == [CLS, VOCAB["good"], VOCAB["movie"], SEP, *[VOCAB["bad"]] * 11, SEP]


@pytest.mark.parametrize("case", ["bert", "roberta", "xlm-roberta"])
@pytest.mark.parametrize("max_length", [63, 64])  # odd or even tokens left for a pair: longest-first splits them
def test_a_long_text_cut_before_tokenizing_keeps_the_tokens_of_the_whole(case: str, max_length: int) -> None:
    tokenizer = TextTokenizer(Tokenizer.from_str(tokenizer_json(case)), max_length, 512)
    whole = Tokenizer.from_str(tokenizer_json(case))  # the reference: every text handed over whole
    whole.no_padding()
    whole.enable_truncation(max_length)
    for seed, (chars, second) in enumerate([(9000, None), (5000, "short"), (4500, 300), (5000, 4600), (4300, 5200)]):
        text = _prose(chars, seed)
        pair = _prose(second, seed + 100) if isinstance(second, int) else second
        batch = tokenizer.encode([text], None if pair is None else [pair])
        expected = whole.encode(text) if pair is None else whole.encode(text, pair)
        assert batch.ids[0, : batch.lengths[0]].tolist() == expected.ids, (seed, chars, second)
        assert bool(batch.truncated[0]) == bool(expected.overflowing)


@pytest.mark.parametrize("case", ["words apart by NBSP only", "long words between punctuation"])
def test_a_text_without_ascii_whitespace_is_cut_between_words(case: str) -> None:
    # Cut blindly READ_CHARS in, "movie" became "movi" + "e" (4 + 1 tokens) and a 200-letter word (one [UNK])
    # 76 + 1 tokens: the counts came out high, so a pair of equal texts gave the odd token to the wrong text, and a
    # text was cut before its kept tokens ended (84 tokens kept of 128).
    max_length = 64 if case.startswith("words") else 128  # 61 tokens left for a pair: odd, split longest first
    tokenizer = TextTokenizer(Tokenizer.from_str(tiny_tokenizer_json()), max_length, 512)
    whole = Tokenizer.from_str(tiny_tokenizer_json())
    whole.no_padding()
    whole.enable_truncation(max_length)
    if case.startswith("words"):
        text, pair = "\u00a0".join(["movie"] * 1000), "good\u00a0" + "\u00a0".join(["movie"] * 999)  # 1000 tokens each
    else:
        text, pair = ("x" * 200 + ".") * 41 + " " + ("y" * 150 + " ") * 300, None
    batch = tokenizer.encode([text], None if pair is None else [pair])
    expected = whole.encode(text) if pair is None else whole.encode(text, pair)
    assert batch.ids[0, : batch.lengths[0]].tolist() == expected.ids
    assert bool(batch.truncated[0]) and expected.overflowing


def test_a_tokenizer_without_a_pair_template_refuses_pairs() -> None:
    raw = Tokenizer.from_str(tiny_tokenizer_json())
    raw.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", CLS),
                                                                                               ("[SEP]", SEP)])
    tokenizer = TextTokenizer(raw, 16, 128, token_types=True)
    assert not tokenizer.pairs and make().pairs
    assert tokenizer.encode(["a"], [None]).size == 1  # singles still work
    with pytest.raises(PairsUnsupportedError) as error:
        tokenizer.encode(["a"], ["b"])
    assert error.value.code == "pairs_unsupported" and status_for(error.value) == 400


def test_the_model_pad_id_pads() -> None:
    tokenizer = TextTokenizer(Tokenizer.from_str(tiny_tokenizer_json()), 16, 128, pad_id=1)
    assert tokenizer.encode(["good movie", "bad"]).ids[1].tolist() == [CLS, VOCAB["bad"], SEP, 1]


def test_tokens_show_each_token_with_its_span_untruncated() -> None:
    tokenizer = make(max_length=4)
    (tokens,) = tokenizer.tokens(["éé good film"])
    assert [(t.text, t.special, t.start, t.stop) for t in tokens] == [
        ("[CLS]", True, None, None), ("é", False, 0, 1), ("é", False, 1, 2), ("good", False, 3, 7),
        ("film", False, 8, 12), ("[SEP]", True, None, None)]
    assert [t.id for t in tokens][1:3] == [VOCAB["e"], VOCAB["##e"]]
    (bare,) = tokenizer.tokens(["good"], add_special_tokens=False)
    assert [t.id for t in bare] == [VOCAB["good"]]


def test_decode_round_trips_and_refuses_unknown_ids() -> None:
    tokenizer = make()
    assert tokenizer.decode([[VOCAB["good"], VOCAB["movie"]], []]) == ["good movie", ""]
    with pytest.raises(InvalidRequestError) as error:
        tokenizer.decode([[VOCAB["good"]], [10_000]])
    assert "ids[1] holds 10000" in error.value.message
