"""Hugging Face <-> glassbox tensor names: exact round trip, and checks that list every problem."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from glassbox.service.errors import ModelLoadError
from glassbox.service.model.bert import BertClassifier
from glassbox.service.model.config import parse_config
from glassbox.service.model.weights import check_hf_tensors, expected_shapes, glassbox_to_hf, hf_to_glassbox
from tests.helpers import tiny_config

CONFIG = parse_config(tiny_config())


def random_model(seed: int = 0) -> BertClassifier:
    model = BertClassifier(CONFIG)
    model.init_weights(torch.Generator().manual_seed(seed), std=0.2)
    with torch.no_grad():  # init_weights zeroes biases and sets norms to 1; make every tensor distinct
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(seed + 1)) * 0.1)
    return model


def test_hf_names_match_transformers() -> None:
    reference = BertForSequenceClassification(BertConfig(**CONFIG.to_hf_dict()))
    names = {k: tuple(v.shape) for k, v in reference.state_dict().items() if not k.endswith("position_ids")}
    ours = {("" if k.startswith("classifier.") else "bert.") + k: v
            for k, v in expected_shapes(CONFIG, with_head=True).items()}
    assert ours == names


def test_round_trip_is_exact() -> None:
    model = random_model()
    hf = glassbox_to_hf(model.state_dict(), CONFIG)
    checked = check_hf_tensors(hf, CONFIG, require_head=True, source="mem")
    back = hf_to_glassbox(checked, CONFIG)
    state = model.state_dict()
    assert set(back) == set(state)
    for name, tensor in state.items():
        assert torch.equal(back[name], tensor), name
    assert all(t.is_contiguous() for t in hf.values())


def test_fused_qkv_is_query_key_value_in_order() -> None:
    model = random_model()
    hf = glassbox_to_hf(model.state_dict(), CONFIG)
    fused = model.state_dict()["layers.1.qkv.weight"]  # [3*hidden, hidden]
    h = CONFIG.hidden_size
    for index, part in enumerate(("query", "key", "value")):
        assert torch.equal(hf[f"bert.encoder.layer.1.attention.self.{part}.weight"], fused[index * h:(index + 1) * h])


def test_encoder_without_prefix_or_head_is_accepted_when_no_head_is_required() -> None:
    hf = glassbox_to_hf(random_model().state_dict(), CONFIG)
    bare = {k.removeprefix("bert."): v for k, v in hf.items() if not k.startswith("classifier.")}
    bare["embeddings.position_ids"] = torch.arange(CONFIG.max_position_embeddings)[None]  # ignored buffer
    checked = check_hf_tensors(bare, CONFIG, require_head=False, source="enc")
    assert "classifier.weight" not in checked and "embeddings.position_ids" not in checked
    assert "classifier.weight" not in hf_to_glassbox(checked, CONFIG)


def test_all_problems_are_listed_together() -> None:
    hf = glassbox_to_hf(random_model().state_dict(), CONFIG)
    del hf["bert.pooler.dense.bias"]
    hf["cls.predictions.bias"] = torch.zeros(3)
    hf["bert.encoder.layer.0.intermediate.dense.weight"] = torch.zeros(65, 32)
    with pytest.raises(ModelLoadError) as caught:
        check_hf_tensors(hf, CONFIG, require_head=True, source="dir/model.safetensors")
    message = str(caught.value)
    assert message.startswith("dir/model.safetensors does not match config.json")
    assert "missing tensors: pooler.dense.bias" in message
    assert "unknown tensors: cls.predictions.bias" in message
    assert "wrong shapes: encoder.layer.0.intermediate.dense.weight is (65, 32), expected (64, 32)" in message


def test_long_lists_are_shortened() -> None:
    with pytest.raises(ModelLoadError, match=r"missing tensors: .* and \d+ more"):
        check_hf_tensors({}, CONFIG, require_head=True, source="empty")


def test_label_count_mismatch_has_a_hint() -> None:
    hf = glassbox_to_hf(random_model().state_dict(), CONFIG)
    hf["classifier.weight"] = torch.zeros(2, 32)
    hf["classifier.bias"] = torch.zeros(2)
    with pytest.raises(ModelLoadError, match="id2label names 3 labels; the head disagrees"):
        check_hf_tensors(hf, CONFIG, require_head=True, source="x")
