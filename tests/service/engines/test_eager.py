"""The eager engine on the CPU: fp32 equals the model, rows ignore their neighbours' padding, int8 stays close."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.ao.nn.quantized import dynamic as quantized_dynamic

from glassbox.service.engines.base import Engine, attention_mask, configure_torch, engine_threads
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.engines.null import NullEngine
from glassbox.service.model.loader import LoadedModel, load_model
from glassbox.service.tokenizer import TextTokenizer
from glassbox.service.types import Bucket, TokenBatch
from tests.helpers import WORDS, make_tiny_model_dir


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(tiny_model_dir)


@pytest.fixture(scope="module")
def tokenizer(loaded: LoadedModel) -> TextTokenizer:
    return TextTokenizer.from_file(loaded.tokenizer_file, 64, loaded.config.max_position_embeddings)


def random_texts(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(0, 70)))) for _ in range(count)]


def test_fp32_equals_the_model(loaded: LoadedModel, tokenizer: TextTokenizer) -> None:
    batch = tokenizer.encode(random_texts(12, seed=0))
    result = EagerEngine(loaded.model).run(batch)
    ids = torch.from_numpy(batch.ids)  # [n, width]
    mask = torch.arange(ids.shape[1])[None, :] < torch.from_numpy(batch.lengths)[:, None]  # [n, width]
    with torch.inference_mode():
        direct = loaded.model(ids, mask).numpy()  # [n, labels]
    assert result.logits.dtype == np.float32 and result.logits.shape == (12, 3)
    np.testing.assert_array_equal(result.logits, direct)


def test_rows_do_not_depend_on_the_padding_around_them(loaded: LoadedModel, tokenizer: TextTokenizer) -> None:
    engine = EagerEngine(loaded.model)
    texts = ["good", *random_texts(7, seed=1), "the " * 100]  # shortest and longest both present
    together = engine.run(tokenizer.encode(texts)).logits
    for row, text in enumerate(texts):
        alone = engine.run(tokenizer.encode([text])).logits  # no padding at all: the mask-free path
        np.testing.assert_allclose(together[row], alone[0], atol=1e-5, rtol=0)
    # Reordering the batch changes nothing either.
    order = np.arange(len(texts))[::-1]
    shuffled = engine.run(tokenizer.encode([texts[i] for i in order])).logits
    np.testing.assert_allclose(shuffled, together[order], atol=1e-5, rtol=0)


def test_int8_is_close_to_fp32(loaded: LoadedModel, tokenizer: TextTokenizer) -> None:
    batch = tokenizer.encode(random_texts(64, seed=2))
    fp32 = EagerEngine(loaded.model).run(batch).logits
    int8 = EagerEngine(loaded.model, quantize="int8").run(batch).logits
    error = float(np.abs(int8 - fp32).max())
    # Dynamic int8 rounds every weight to 1/127 of its row's range: a few percent of the logit scale, not more.
    assert 0 < error <= 0.15 * float(np.abs(fp32).max())
    # A row whose top-2 margin exceeds twice the largest logit error cannot flip; and most rows keep their label.
    top2 = np.sort(fp32, axis=1)[:, -2:]
    safe = top2[:, 1] - top2[:, 0] > 2 * error
    agree = fp32.argmax(axis=1) == int8.argmax(axis=1)
    assert agree[safe].all()
    assert agree.mean() >= 0.9


def test_int8_really_quantizes_the_encoder_linears_and_leaves_the_model_alone(loaded: LoadedModel) -> None:
    engine = EagerEngine(loaded.model, quantize="int8")
    assert engine.kind == "eager-int8"
    assert isinstance(engine.model, nn.Module)
    layers = engine.model.layers
    assert isinstance(layers, nn.ModuleList) and len(layers) == loaded.config.num_hidden_layers
    for index, layer in enumerate(layers):
        for name in ("qkv", "attn_out", "ffn_up", "ffn_down"):
            module = getattr(layer, name)
            if (index, name) == (0, "ffn_down"):  # kept fp32 on purpose: its input carries the widest outliers
                assert type(module) is nn.Linear
                continue
            assert isinstance(module, quantized_dynamic.Linear), name
            assert module.weight().dtype == torch.qint8  # type: ignore[no-untyped-call]
            assert module.weight().qscheme() == torch.per_channel_affine  # type: ignore[no-untyped-call]
    assert sum(type(m) is nn.Linear for m in layers.modules()) == 1
    assert type(engine.model.classifier) is nn.Linear  # the head stays fp32
    # The caller's fp32 model is not touched (the fp32 engine or a fallback may share it).
    assert type(loaded.model.layers[0].qkv) is nn.Linear


def test_int8_only_on_cpu(loaded: LoadedModel) -> None:
    with pytest.raises(ValueError, match="CPU"):
        EagerEngine(loaded.model, device="cuda:0", quantize="int8")


def test_bf16_on_cpu_is_close_and_does_not_change_the_model(loaded: LoadedModel, tokenizer: TextTokenizer) -> None:
    batch = tokenizer.encode(random_texts(8, seed=3))
    fp32 = EagerEngine(loaded.model).run(batch).logits
    engine = EagerEngine(loaded.model, dtype="bf16")
    bf16 = engine.run(batch).logits
    assert engine.kind == "eager-bf16" and bf16.dtype == np.float32
    assert next(loaded.model.parameters()).dtype == torch.float32
    assert np.abs(bf16 - fp32).max() <= 0.1 * np.abs(fp32).max()


def test_timing_record(loaded: LoadedModel, tokenizer: TextTokenizer) -> None:
    batch = tokenizer.encode(["good", "the plot very very slow", ""])
    timing = EagerEngine(loaded.model).run(batch).timing
    assert timing.rows == 3
    assert timing.real_tokens == 3 + 7 + 2
    assert timing.padded_tokens == 3 * 7
    assert timing.padding_ratio == pytest.approx(1 - 12 / 21)
    assert timing.mode == "eager" and timing.bucket is None and timing.device == "cpu"
    assert 0 < timing.start_ns <= timing.end_ns and timing.duration_s >= 0


def test_empty_batch_gives_empty_logits(loaded: LoadedModel) -> None:
    empty = TokenBatch(np.zeros((0, 0), np.int64), np.zeros(0, np.int64), np.zeros(0, np.bool_))
    result = EagerEngine(loaded.model).run(empty)
    assert result.logits.shape == (0, 3) and result.timing.rows == 0


def test_warmup_report_and_health(loaded: LoadedModel) -> None:
    shapes = (Bucket(1, 16), Bucket(4, 32))
    engine = EagerEngine(loaded.model, warmup_shapes=shapes)
    report = engine.warmup()
    assert report.device == "cpu" and report.kind == "eager-fp32"
    assert report.executor == engine.executor == "torchscript"  # what the ready line names beside the kind
    assert report.buckets == shapes and report.seconds >= 0 and report.graph_pool_bytes == 0
    health = engine.health()
    assert health.ok and health.device == "cpu" and health.kind == "eager-fp32"
    assert isinstance(engine, Engine)


def test_warmup_never_exceeds_the_model_positions(tmp_path: Path) -> None:
    short = load_model(make_tiny_model_dir(tmp_path / "short", max_position_embeddings=24))
    report = EagerEngine(short.model, warmup_shapes=(Bucket(1, 16), Bucket(8, 64))).warmup()
    assert report.buckets == (Bucket(1, 16), Bucket(8, 24))


def test_too_long_input_is_a_clear_error(loaded: LoadedModel) -> None:
    ids = torch.zeros((1, loaded.config.max_position_embeddings + 1), dtype=torch.int64)
    with pytest.raises(ValueError, match="exceeds the model's 128 positions"):
        loaded.model(ids, None)


def test_attention_mask_helper() -> None:
    assert attention_mask(np.array([4, 4]), 4) is None  # nothing to hide: the fast path
    mask = attention_mask(np.array([4, 1, 2]), 4)
    assert mask is not None and mask.dtype == np.bool_
    assert mask.tolist() == [[True] * 4, [True, False, False, False], [True, True, False, False]]


def test_configure_torch_sets_threads_and_seeds() -> None:
    before = torch.get_num_threads()
    try:
        configure_torch(1, seed=7)
        assert torch.get_num_threads() == 1
        first = torch.rand(3)
        configure_torch(0, seed=7)  # 0 leaves the thread count alone
        assert torch.get_num_threads() == 1
        assert torch.equal(torch.rand(3), first)
    finally:
        torch.set_num_threads(before)


def test_engine_threads_default_to_two_for_a_concurrent_engine_on_two_cores_or_more() -> None:
    class Serial:
        concurrent = False

    null = NullEngine(2)
    assert engine_threads(0, null, cores=2) == 2 and engine_threads(0, null, cores=1) == 1
    assert engine_threads(3, null, cores=2) == 3  # asked for: as asked
    serial: Engine = Serial()  # type: ignore[assignment]
    assert engine_threads(0, serial, cores=16) == 1 and engine_threads(4, serial, cores=16) == 1


def test_only_the_recorded_cpu_forward_pass_may_run_concurrently(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir).model
    assert EagerEngine(model).concurrent
    assert not EagerEngine(model, executor="python").concurrent
