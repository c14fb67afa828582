"""Every family against transformers: tiny random classifiers built with transformers' own classes and saved with
`save_pretrained` (tests/families.py), loaded by glassbox, logits within 1e-4 of transformers' on padded and packed
batches, single texts and text pairs, for single-label, multi-label and regression heads. Then the same through the
tokenizer (glassbox's TokenBatch against transformers' tokenizer output), the eager engine and the CUDA graph engine
with the CPU rehearsal capturer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from glassbox.service.buckets import BucketTable
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.engines.graph_capture import EagerRehearsalCapturer
from glassbox.service.engines.graphs import CudaGraphEngine
from glassbox.service.model.loader import LoadedModel, load_model
from glassbox.service.types import TokenBatch
from tests.families import FAMILY_CASES, HEADS, save_family_model

TOLERANCE = 1e-4
FIRST_ID = 5  # ids below this are special tokens in every tokenizer of tests/families.py
TYPED = ("bert", "electra")  # the families whose embeddings read token type ids
TEXTS = ["a very good movie", "the worst film and a boring plot", "great", "Café — très bien 🎬", "", "sad " * 60]
SECONDS = ["what a film", "boring", "le film était très bien", "deep learning is a kind of machine learning",
           "x", "paris is the capital of france"]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: thread hand-off on a shared machine costs more than the arithmetic
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("families")
    return {(case, head): save_family_model(root / f"{case}-{head}", case, head).path
            for case in FAMILY_CASES for head in HEADS}


def random_batch(generator: torch.Generator, vocab: int, pad: int, lengths: list[int],
                 pairs: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, mask and token type ids, all [n, max(lengths)]: right-padded rows; with `pairs`, each row's second
    segment (type 1) starts at a random point inside it."""
    width = max(lengths)
    ids = torch.randint(FIRST_ID, vocab, (len(lengths), width), generator=generator)  # [n, width]
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]  # [n, width]
    types = torch.zeros_like(ids)
    if pairs:
        for row, length in enumerate(lengths):
            split = int(torch.randint(1, max(2, length), (1,), generator=generator))
            types[row, split:length] = 1
    return ids.masked_fill(~mask, pad), mask, types


def worst_difference(loaded: LoadedModel, reference: torch.nn.Module, pairs: bool, unpad: bool) -> float:
    config = loaded.config
    loaded.model.unpad = unpad
    generator = torch.Generator().manual_seed(7)
    limit = config.max_tokens
    worst = 0.0
    for lengths in ([1], [limit], [limit, 2, 3, limit // 2, limit - 1], [5, 9, 17], [12, 12, 12]):
        ids, mask, types = random_batch(generator, config.vocab_size, config.pad_token_id, lengths, pairs)
        full = bool(mask.all())
        kwargs = {"token_type_ids": types} if config.family in ("bert", "electra") else {}
        with torch.inference_mode():
            ours = loaded.model(ids, None if full else mask, types)  # [n, labels]
            theirs = reference(input_ids=ids, attention_mask=mask.long(), **kwargs).logits  # [n, labels]
        assert ours.shape == theirs.shape == (len(lengths), config.num_labels)
        worst = max(worst, float((ours - theirs).abs().max()))
    return worst


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("case", FAMILY_CASES)
def test_logits_match_transformers(models: dict[tuple[str, str], Path], case: str, head: str) -> None:
    path = models[(case, head)]
    loaded = load_model(path)
    assert loaded.config.problem_type == HEADS[head][0]
    assert loaded.config.uses_token_types == (case in TYPED)
    reference = AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    for pairs in (False, True):
        for unpad in (True, False):  # the packed path, and the padded path the graph engine runs
            worst = worst_difference(loaded, reference, pairs, unpad)
            assert worst <= TOLERANCE, f"{case}/{head} pairs={pairs} unpad={unpad}: max |difference| {worst:.3g}"


def test_token_types_change_the_logits_only_where_the_family_reads_them(models: dict[tuple[str, str], Path]) -> None:
    """A check that the pair path is not vacuous: segment B changes BERT's and ELECTRA's logits, nobody else's."""
    for case in FAMILY_CASES:
        loaded = load_model(models[(case, "single")])
        ids, _, types = random_batch(torch.Generator().manual_seed(3), loaded.config.vocab_size,
                                     loaded.config.pad_token_id, [10, 10], pairs=True)
        with torch.inference_mode():
            changed = not torch.equal(loaded.model(ids, None, types), loaded.model(ids, None, None))
        assert changed == (case in TYPED), case


def encoded(path: Path, texts: list[str], seconds: list[str] | None, max_length: int) -> dict[str, torch.Tensor]:
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    batch = tokenizer(texts, seconds, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return dict(batch)


@pytest.mark.parametrize("case", FAMILY_CASES)
@pytest.mark.parametrize("pairs", [False, True], ids=["singles", "pairs"])
def test_tokenized_text_through_the_engine_matches_transformers(models: dict[tuple[str, str], Path], case: str,
                                                                pairs: bool) -> None:
    """Real text through glassbox's tokenizer and eager engine (TorchScript recording) against transformers' tokenizer
    and model: the same ids and type ids, row by row, and logits within 1e-4."""
    path = models[(case, "single")]
    loaded = load_model(path)
    seconds = SECONDS if pairs else None
    max_length = 48
    ours = loaded.text_tokenizer(max_length).encode(TEXTS, seconds)
    theirs = encoded(path, TEXTS, seconds, max_length)
    for row in range(ours.size):
        length = int(ours.lengths[row])
        assert ours.ids[row, :length].tolist() == theirs["input_ids"][row][theirs["attention_mask"][row] == 1].tolist()
        if case in TYPED and pairs:
            assert ours.type_ids is not None
            want = theirs["token_type_ids"][row][:length].tolist()
            assert ours.type_ids[row, :length].tolist() == want and 1 in want
    assert (ours.type_ids is not None) == (pairs and case in TYPED)
    assert bool(ours.truncated[-1]) and ours.lengths.max() == max_length
    reference = AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    with torch.inference_mode():
        want_logits = reference(**theirs).logits.numpy()  # [n, labels]
    engine = EagerEngine(loaded.model, "cpu")
    assert engine.executor == "torchscript"
    np.testing.assert_allclose(engine.run(ours).logits, want_logits, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_graph_engine_rehearsal_matches_eager(models: dict[tuple[str, str], Path], case: str) -> None:
    """The CUDA graph engine's bookkeeping (static buffers with token types, buckets, padding rows) on the CPU
    rehearsal capturer, for singles and pairs: logits equal the eager engine's."""
    loaded = load_model(models[(case, "multi")])
    engine = CudaGraphEngine(loaded.model, "cpu", "fp32", BucketTable(batches=(1, 4, 8), lengths=(16, 32, 64)),
                             capturer=EagerRehearsalCapturer())
    engine.warmup()
    eager = EagerEngine(loaded.model, "cpu", executor="python")
    tokenizer = loaded.text_tokenizer(64)
    for batch in (tokenizer.encode(TEXTS), tokenizer.encode(TEXTS, SECONDS), tokenizer.encode(TEXTS[:3], SECONDS[:3])):
        got = engine.run(batch)
        assert got.timing.mode == "graph"
        np.testing.assert_allclose(got.logits, eager.run(batch).logits, rtol=0, atol=TOLERANCE)


def int8_agreement(loaded: LoadedModel, batch: TokenBatch) -> tuple[float, float]:
    """(share of rows whose best label int8 and fp32 agree on, max |logit difference|)."""
    fp32 = EagerEngine(loaded.model, "cpu").run(batch).logits
    int8 = EagerEngine(loaded.model, "cpu", quantize="int8").run(batch).logits
    return float((fp32.argmax(1) == int8.argmax(1)).mean()), float(np.abs(fp32 - int8).max())


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_int8_agrees_with_fp32(models: dict[tuple[str, str], Path], case: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    """int8 (dynamic, per-channel) against fp32 on every family, singles and pairs mixed: the same best label on at
    least 95% of rows and logits within a tenth of their spread. The figures are printed for docs/models.md."""
    loaded = load_model(models[(case, "single")])
    batch = loaded.text_tokenizer(64).encode(TEXTS * 4 + SECONDS * 4, SECONDS * 4 + [None] * 24)
    agreement, difference = int8_agreement(loaded, batch)
    spread = float(np.ptp(EagerEngine(loaded.model, "cpu").run(batch).logits))
    with capsys.disabled():
        print(f"\nint8 vs fp32 {case}: top-1 agreement {agreement:.3f}, max |logit difference| {difference:.2e} "
              f"(logit spread {spread:.2e})")
    assert agreement >= 0.95 and difference <= 0.1 * spread


# bf16 keeps 8 significant bits: each value it stores is off by up to 2^-9 of itself. The encoder runs in bf16 (the CPU
# kernels of LayerNorm, softmax and attention accumulate in fp32 inside), the head in fp32. Measured on these
# models (logits up to ~0.2 in size): at most 2.7e-3 of difference over the 18 family x head cases; the bound below
# is ~4x that, and still ~20x below the logits' own size.
BF16_TOLERANCE = 1e-2


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("case", FAMILY_CASES)
def test_bf16_agrees_with_fp32(models: dict[tuple[str, str], Path], case: str, head: str) -> None:
    """The CPU's bf16 engine against its fp32 engine, every family and head, singles and pairs mixed: logits within
    BF16_TOLERANCE, and the same answers (top label, or the labels over the threshold) on every row."""
    loaded = load_model(models[(case, head)])
    batch = loaded.text_tokenizer(64).encode(TEXTS * 4 + SECONDS * 4, SECONDS * 4 + [None] * 24)
    fp32 = EagerEngine(loaded.model, "cpu").run(batch).logits
    bf16_engine = EagerEngine(loaded.model, "cpu", "bf16")
    assert bf16_engine.kind == "eager-bf16" and bf16_engine.executor == "torchscript"
    bf16 = bf16_engine.run(batch).logits
    assert bf16.dtype == np.float32 and bf16.shape == fp32.shape
    assert float(np.abs(fp32 - bf16).max()) <= BF16_TOLERANCE
    if head == "single":
        assert (fp32.argmax(1) == bf16.argmax(1)).all()
    elif head == "multi":
        assert ((fp32 > 0) == (bf16 > 0)).mean() >= 0.99
