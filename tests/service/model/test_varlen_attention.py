"""Packed batches attend text by text (BertClassifier.varlen_attention): the same logits as attention on the padded
grid, kept by the TorchScript recording for every batch size, and never used while training."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from glassbox.service.engines.script import script_forward
from glassbox.service.model import bert
from glassbox.service.model.loader import LoadedModel, load_model


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(tiny_model_dir)


def mixed_batch(generator: torch.Generator, lengths: list[int], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq = max(lengths)
    ids = torch.randint(5, vocab, (len(lengths), seq), generator=generator)  # [batch, seq]
    mask = torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]  # [batch, seq]
    return ids, mask


def logits(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, varlen: bool) -> torch.Tensor:
    model.varlen_attention = varlen
    try:
        with torch.inference_mode():
            out: torch.Tensor = model(ids, mask)
    finally:
        model.varlen_attention = True
    return out


@pytest.mark.parametrize("lengths", [[1, 5], [7, 2, 3], [2, 30, 4, 17, 9, 2, 11], [6, 6, 1]])
def test_text_by_text_equals_the_masked_grid(loaded: LoadedModel, lengths: list[int]) -> None:
    ids, mask = mixed_batch(torch.Generator().manual_seed(len(lengths)), lengths, loaded.config.vocab_size)
    torch.testing.assert_close(logits(loaded.model, ids, mask, True), logits(loaded.model, ids, mask, False),
                               atol=1e-5, rtol=1e-5)


def test_the_recording_keeps_the_loop_over_texts(loaded: LoadedModel) -> None:
    """Recorded on a batch of two, the forward pass must answer batches of other sizes as Python does (a trace of a
    plain Python loop would have unrolled it for two texts)."""
    recorded = script_forward(loaded.model, torch.device("cpu"))
    assert recorded is not None
    generator = torch.Generator().manual_seed(3)
    for lengths in ([4, 1, 9], [3, 12, 5, 5, 2, 8], [2]):
        ids, mask = mixed_batch(generator, lengths, loaded.config.vocab_size)
        with torch.inference_mode():
            torch.testing.assert_close(recorded(ids, mask, None), logits(loaded.model, ids, mask, False),
                                       atol=1e-5, rtol=1e-5)


def test_training_attends_on_the_grid(loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropout in attention draws on the grid's shape: the training recipe must not change with this inference path."""
    def refuse() -> None:
        raise AssertionError("text-by-text attention used while training")

    model = load_model(loaded.path).model
    ids, mask = mixed_batch(torch.Generator().manual_seed(4), [3, 8], loaded.config.vocab_size)
    monkeypatch.setattr(bert, "varlen_attention", refuse)
    model.train()
    model(ids, mask)  # would raise with the text-by-text path
    model.eval()
    with pytest.raises(AssertionError, match="while training"):
        model(ids, mask)
