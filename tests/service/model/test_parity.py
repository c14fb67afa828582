"""Our forward pass against the reference implementation in transformers: max |logits difference| <= 1e-4 in fp32.

Inputs are random ids with varied lengths from 1 to the model's limit, padded on the right, several rows of
different lengths per batch, plus batches without padding (our attention_mask=None fast path).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import BertForSequenceClassification

from glassbox.service.model.bert import BertClassifier
from glassbox.service.model.loader import load_model, save_model
from glassbox.service.tokenizer import TextTokenizer
from tests.helpers import make_tiny_model_dir, tiny_tokenizer_json

TOLERANCE = 1e-4
FIRST_ID = 5  # ids below this are [PAD], [UNK], [CLS], [SEP], [MASK] in the tiny vocabulary


def reference(path: Path) -> BertForSequenceClassification:
    model: BertForSequenceClassification = BertForSequenceClassification.from_pretrained(
        str(path), dtype=torch.float32
    )
    model.eval()  # type: ignore[no-untyped-call]
    return model


def random_batch(
    generator: torch.Generator, vocab: int, pad: int, lengths: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [n, max(lengths)] int64 right-padded with `pad`, mask [n, max(lengths)] bool."""
    width = max(lengths)
    ids = torch.randint(FIRST_ID, vocab, (len(lengths), width), generator=generator)  # [n, width]
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]  # [n, width]
    return ids.masked_fill(~mask, pad), mask


def length_sets(generator: torch.Generator, limit: int, random_sizes: tuple[int, ...]) -> list[list[int]]:
    """Batches of mixed lengths covering 1 and the limit, plus random ones of the given sizes."""
    sets = [[1], [limit], [limit, 1, 2, limit // 2, limit - 1]]
    sets += [torch.randint(1, limit + 1, (size,), generator=generator).tolist() for size in random_sizes]
    return sets


def max_difference(ours: BertClassifier, theirs: BertForSequenceClassification, ids: torch.Tensor,
                   mask: torch.Tensor | None) -> float:
    with torch.inference_mode():
        a = ours(ids, mask)  # [n, labels]
        b = theirs(input_ids=ids, attention_mask=None if mask is None else mask.long()).logits  # [n, labels]
    assert a.shape == b.shape
    return float((a - b).abs().max())


def check_parity(path: Path, limit: int | None = None, seed: int = 0, random_sizes: tuple[int, ...] = (3, 8),
                 unpad: bool = True, varlen: bool = True) -> None:
    loaded = load_model(path)
    loaded.model.unpad = unpad  # True: padded batches run on real tokens only; False: the padded [batch, seq] path
    loaded.model.varlen_attention = varlen  # packed: attention text by text, or on the padded grid with a mask
    theirs = reference(path)
    config = loaded.config
    limit = limit or config.max_position_embeddings
    generator = torch.Generator().manual_seed(seed)
    worst = 0.0
    for lengths in length_sets(generator, limit, random_sizes):
        ids, mask = random_batch(generator, config.vocab_size, config.pad_token_id, lengths)
        worst = max(worst, max_difference(loaded.model, theirs, ids, mask))
    # Junk ids instead of [PAD] in the padding of a mixed batch: the mask alone must hide them.
    ids, mask = random_batch(generator, config.vocab_size, config.pad_token_id, [limit // 2, 1, 3])
    junk = torch.where(mask, ids, torch.randint(FIRST_ID, config.vocab_size, ids.shape, generator=generator))
    worst = max(worst, max_difference(loaded.model, theirs, junk, mask))
    for n, width in ((1, 1), (4, max(1, limit // 4)), (2, limit)):  # no padding: attention_mask=None on both sides
        ids, _ = random_batch(generator, config.vocab_size, config.pad_token_id, [width] * n)
        worst = max(worst, max_difference(loaded.model, theirs, ids, None))
    assert worst <= TOLERANCE, f"max |logits difference| {worst:.3g} > {TOLERANCE}"


PATHS = pytest.mark.parametrize(("unpad", "varlen"), [(True, True), (True, False), (False, False)],
                                 ids=["packed", "packed-grid", "padded"])


@PATHS
def test_parity_tiny_model(tiny_model_dir: Path, unpad: bool, varlen: bool) -> None:
    check_parity(tiny_model_dir, unpad=unpad, varlen=varlen)


@pytest.mark.parametrize("act", ["gelu_new", "gelu_pytorch_tanh", "relu"])
def test_parity_activation_variants(tmp_path: Path, act: str) -> None:
    check_parity(make_tiny_model_dir(tmp_path / act, seed=1, hidden_act=act), seed=1)


def test_parity_minilm_shaped_random_model(tmp_path: Path) -> None:
    """The default model's layer geometry (hidden 384, 12 heads of 32, 512 positions; 2 of its 6 layers, to keep
    the test quick) with random weights, so parity at real sizes is checked even before the default model exists."""
    path = make_tiny_model_dir(tmp_path / "minilm", seed=2, hidden_size=384, num_attention_heads=12,
                               num_hidden_layers=2, intermediate_size=1536, max_position_embeddings=512)
    # std 0.2 on 384-wide layers would saturate every tanh; rescale to BERT's usual 0.02 for meaningful logits.
    loaded = load_model(path)
    loaded.model.init_weights(torch.Generator().manual_seed(2), std=0.02)
    save_model(path, loaded.model, tiny_tokenizer_json())
    check_parity(path, limit=512, seed=2, random_sizes=(3,))


@PATHS
def test_parity_default_model(default_model_path: Path, unpad: bool, varlen: bool) -> None:
    check_parity(default_model_path, limit=256, seed=3, random_sizes=(4,), unpad=unpad, varlen=varlen)


def test_parity_default_model_on_real_text(default_model_path: Path) -> None:
    loaded = load_model(default_model_path)
    tokenizer = TextTokenizer.from_file(loaded.tokenizer_file, 256, loaded.config.max_position_embeddings)
    texts = ["", "A quiet, beautifully acted film.", "Worst. Movie. Ever. 😡", "e\u0301le\u0301gant",
             "مرحبا " * 10, "an overlong, tedious mess " * 80]
    batch = tokenizer.encode(texts)
    ids = torch.from_numpy(batch.ids)  # [n, width]
    mask = torch.arange(ids.shape[1])[None, :] < torch.from_numpy(batch.lengths)[:, None]  # [n, width]
    worst = max_difference(loaded.model, reference(default_model_path), ids, mask)
    assert worst <= TOLERANCE
