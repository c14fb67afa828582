"""config.json parsing: what is accepted, and what each refusal says."""

from __future__ import annotations

from typing import Any

import pytest

from glassbox.service.errors import ModelLoadError, UnsupportedArchitectureError
from glassbox.service.model.config import SUPPORTED_ACTIVATIONS, parse_config
from tests.helpers import tiny_config


def test_tiny_config_parses() -> None:
    config = parse_config(tiny_config())
    assert config.hidden_size == 32 and config.num_attention_heads == 4 and config.head_dim == 8
    assert config.id2label == ("negative", "positive", "neutral") and config.num_labels == 3
    assert config.architecture == "BertForSequenceClassification"


def test_defaults_for_optional_fields() -> None:
    raw = tiny_config()
    for key in ("max_position_embeddings", "type_vocab_size", "layer_norm_eps", "hidden_act", "pad_token_id",
                "architectures", "id2label"):
        del raw[key]
    config = parse_config(raw)
    assert config.max_position_embeddings == 512 and config.type_vocab_size == 2
    assert config.layer_norm_eps == 1e-12 and config.hidden_act == "gelu" and config.pad_token_id == 0
    assert config.architecture == "BertModel" and config.id2label == ()


def test_a_classifier_without_id2label_gets_transformers_default_names() -> None:
    raw = tiny_config()
    del raw["id2label"]
    config = parse_config(raw)  # transformers 5 leaves default labels out of config.json; its pipeline says LABEL_i
    assert config.id2label == ("LABEL_0", "LABEL_1") and not config.labels_named
    assert parse_config({**raw, "num_labels": 3}).id2label == ("LABEL_0", "LABEL_1", "LABEL_2")
    assert parse_config(tiny_config()).labels_named
    with pytest.raises(ModelLoadError, match="'num_labels' must be a positive integer"):
        parse_config({**raw, "num_labels": 0})


def test_hf_dict_round_trips() -> None:
    config = parse_config(tiny_config(hidden_act="gelu_new", pad_token_id=3))
    assert parse_config(config.to_hf_dict()) == config


def test_id2label_is_ordered_by_index_not_by_key_order() -> None:
    config = parse_config(tiny_config(id2label={"1": "pos", "0": "neg"}))
    assert config.id2label == ("neg", "pos")


@pytest.mark.parametrize("act", SUPPORTED_ACTIVATIONS)
def test_supported_activations(act: str) -> None:
    assert parse_config(tiny_config(hidden_act=act)).hidden_act == act


@pytest.mark.parametrize("model_type, architectures", [
    ("gpt2", ["GPT2ForSequenceClassification"]),
    ("deberta-v2", ["DebertaV2ForSequenceClassification"]),
    ("roberta", ["BertForSequenceClassification"]),  # a known family, another family's classifier
    ("distilbert", ["DistilBertForTokenClassification"]),
    (None, ["BertForSequenceClassification"]),
    ("bert", ["BertForMaskedLM"]),
    ("bert", "BertForSequenceClassification"),  # a string where a list belongs
])
def test_unsupported_architecture_names_what_is_supported(model_type: Any, architectures: Any) -> None:
    with pytest.raises(UnsupportedArchitectureError) as caught:
        parse_config(tiny_config(model_type=model_type, architectures=architectures), source="x/config.json")
    message = str(caught.value)
    assert message.startswith("x/config.json")
    assert repr(model_type) in message
    assert "MiniLM" in message
    for name in ("bert", "distilbert", "roberta", "xlm-roberta", "camembert", "electra",
                 "BertForSequenceClassification", "DistilBertForSequenceClassification",
                 "XLMRobertaForSequenceClassification", "ElectraForSequenceClassification"):
        assert name in message


@pytest.mark.parametrize("overrides, expected", [
    ({"hidden_size": 30}, "hidden_size 30 is not divisible by num_attention_heads 4"),
    ({"hidden_size": 0}, "'hidden_size' must be a positive integer"),
    ({"num_hidden_layers": "2"}, "'num_hidden_layers' must be a positive integer"),
    ({"vocab_size": True}, "'vocab_size' must be a positive integer"),
    ({"hidden_act": "swish"}, "hidden_act 'swish' is not supported (supported: gelu"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ({"id2label": ["neg", "pos"]}, "'id2label' must be an object"),
    ({"id2label": {"zero": "neg"}}, "'id2label' keys must be integers"),
    ({"id2label": {"0": "neg", "2": "pos"}}, "'id2label' indices must be 0..1 without gaps"),
    ({"layer_norm_eps": -1}, "'layer_norm_eps' must be a positive number"),
    ({"layer_norm_eps": "1e-12"}, "'layer_norm_eps' must be a positive number"),
    ({"pad_token_id": 10_000}, "'pad_token_id' must be an integer in 0.."),
    ({"pad_token_id": -1}, "'pad_token_id' must be an integer in 0.."),
])
def test_inconsistent_config_is_one_clear_error(overrides: dict[str, Any], expected: str) -> None:
    with pytest.raises(ModelLoadError) as caught:
        parse_config(tiny_config(**overrides), source="m/config.json")
    assert type(caught.value) is ModelLoadError
    assert str(caught.value).startswith("m/config.json is inconsistent: ")
    assert expected in str(caught.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ModelLoadError) as caught:
        parse_config(tiny_config(hidden_size=30, hidden_act="swish", intermediate_size=-3))
    message = str(caught.value)
    assert "not divisible" in message and "swish" in message and "intermediate_size" in message


def test_null_pad_token_id_means_zero() -> None:
    assert parse_config(tiny_config(pad_token_id=None)).pad_token_id == 0
