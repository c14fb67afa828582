"""Parse and validate a Hugging Face `config.json` for the encoder families in `glassbox.service.model.families`."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from glassbox.service.errors import ModelLoadError, UnsupportedArchitectureError
from glassbox.service.model.families import Family, family_of, supported_summary
from glassbox.service.types import PROBLEM_TYPES, ProblemType

SUPPORTED_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")

# DistilBERT's config.json names the same dimensions differently (transformers maps them with an attribute map).
_DISTILBERT_KEYS = {
    "hidden_size": "dim", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
    "intermediate_size": "hidden_dim", "hidden_act": "activation",
}


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int  # 0: the family has no token type embedding (DistilBERT)
    layer_norm_eps: float
    hidden_act: str
    pad_token_id: int
    id2label: tuple[str, ...]  # index -> label name; () for an encoder without a head
    architecture: str
    family: str = "bert"  # a Family name: bert, distilbert, roberta, electra
    model_type: str = "bert"  # as config.json says (xlm-roberta and camembert are the roberta family)
    embedding_size: int = 0  # 0: the hidden size (ELECTRA's small embeddings are projected up)
    problem_type: ProblemType = "single_label_classification"
    # False: config.json has no id2label and the labels are transformers' default names (LABEL_0, LABEL_1, ...)
    labels_named: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    @property
    def embedding_width(self) -> int:
        return self.embedding_size or self.hidden_size

    @property
    def position_offset(self) -> int:
        """Where position ids start: RoBERTa-style models count from pad_token_id + 1 (fairseq's convention)."""
        return self.pad_token_id + 1 if family_named(self.family).offset_positions else 0

    @property
    def max_tokens(self) -> int:
        """The longest input, special tokens included, that the position embeddings cover."""
        return self.max_position_embeddings - self.position_offset

    @property
    def uses_token_types(self) -> bool:
        """Token type ids (segment A / B of a text pair) reach the embeddings."""
        return family_named(self.family).token_types and self.type_vocab_size > 1

    def to_hf_dict(self) -> dict[str, Any]:
        """The BERT `config.json` transformers reads for a sequence classifier with these dimensions."""
        if self.family != "bert":
            raise ValueError(f"only BERT configs are written by glassbox, not {self.family}")
        return {
            "architectures": ["BertForSequenceClassification"],
            "model_type": "bert",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "type_vocab_size": self.type_vocab_size,
            "layer_norm_eps": self.layer_norm_eps,
            "hidden_act": self.hidden_act,
            "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1,
            "pad_token_id": self.pad_token_id,
            "position_embedding_type": "absolute",
            "id2label": {str(i): name for i, name in enumerate(self.id2label)},
            "label2id": {name: i for i, name in enumerate(self.id2label)},
            **({} if self.problem_type == "single_label_classification" else {"problem_type": self.problem_type}),
        }


def family_named(name: str) -> Family:
    family = family_of(name)
    if family is None:
        raise ValueError(f"no model family {name!r}")
    return family


def _require_int(raw: dict[str, Any], key: str, problems: list[str], default: int | None = None) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        problems.append(f"'{key}' must be a positive integer (found {value!r})")
        return 1
    return value


def _family(raw: dict[str, Any], source: str) -> tuple[Family, str]:
    model_type = raw.get("model_type")
    family = family_of(model_type)
    architectures = raw.get("architectures") or [family.encoder if family else "?"]
    architecture = str(architectures[0]) if isinstance(architectures, list) and architectures else "?"
    if family is None or architecture not in (*family.classifiers, family.encoder):
        raise UnsupportedArchitectureError(
            f"{source}: model_type={model_type!r}, architectures={architectures!r} is not supported; glassbox serves "
            f"sequence classifiers of the BERT family (BERT, MiniLM, DistilBERT, RoBERTa, XLM-RoBERTa, CamemBERT, "
            f"ELECTRA): {supported_summary()}"
        )
    return family, architecture


def _problem_type(raw: dict[str, Any], labels: tuple[str, ...], problems: list[str]) -> ProblemType:
    value = raw.get("problem_type")
    if value is None:
        return "single_label_classification"
    if value not in PROBLEM_TYPES:
        problems.append(f"'problem_type' must be one of {', '.join(PROBLEM_TYPES)} (found {value!r})")
        return "single_label_classification"
    if value == "regression" and len(labels) > 1:
        problems.append(f"a regression head answers one number, but id2label names {len(labels)} outputs")
    return cast(ProblemType, value)


def parse_config(raw: dict[str, Any], *, source: str = "config.json") -> ModelConfig:
    family, architecture = _family(raw, source)
    if family.name == "distilbert":
        # Read DistilBERT's own keys under the common names; its LayerNorms use a fixed eps.
        raw = {**raw, **{ours: raw[theirs] for ours, theirs in _DISTILBERT_KEYS.items() if theirs in raw},
               "layer_norm_eps": 1e-12, "type_vocab_size": 0}
    problems: list[str] = []
    hidden = _require_int(raw, "hidden_size", problems)
    heads = _require_int(raw, "num_attention_heads", problems)
    if hidden % heads:
        problems.append(f"hidden_size {hidden} is not divisible by num_attention_heads {heads}")
    act = raw.get("hidden_act", "gelu")
    if act not in SUPPORTED_ACTIVATIONS:
        problems.append(f"hidden_act {act!r} is not supported (supported: {', '.join(SUPPORTED_ACTIVATIONS)})")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        problems.append("only position_embedding_type 'absolute' is supported")
    labels = _parse_labels(raw.get("id2label"), problems)
    named = True
    if raw.get("id2label") is None and architecture.endswith("ForSequenceClassification"):
        # transformers leaves id2label out of config.json when it holds its default names, and its pipeline then
        # answers LABEL_0, LABEL_1, ...: num_labels of them (2 when that is absent too, transformers' default).
        labels, named = _default_labels(raw.get("num_labels", 2), problems), False
    eps = raw.get("layer_norm_eps", 1e-12)
    # json.loads takes Infinity: every LayerNorm would then answer zeros, and every text the same scores.
    if not isinstance(eps, int | float) or isinstance(eps, bool) or not 0 < eps < math.inf:
        problems.append(f"'layer_norm_eps' must be a positive number (found {eps!r})")
        eps = 1e-12
    vocab = _require_int(raw, "vocab_size", problems)
    pad = raw.get("pad_token_id", 0)
    if pad is None:
        pad = 0  # some configs write null; padded positions are masked, so any in-range id serves
    if not isinstance(pad, int) or isinstance(pad, bool) or not 0 <= pad < vocab:
        problems.append(f"'pad_token_id' must be an integer in 0..{vocab - 1} (found {pad!r})")
        pad = 0
    types = raw.get("type_vocab_size", 2)
    if family.name != "distilbert":
        types = _require_int(raw, "type_vocab_size", problems, 2)
    embedding_size = 0
    if family.name == "electra" and raw.get("embedding_size", hidden) != hidden:
        embedding_size = _require_int(raw, "embedding_size", problems)
    config = ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=_require_int(raw, "num_hidden_layers", problems),
        num_attention_heads=heads,
        intermediate_size=_require_int(raw, "intermediate_size", problems),
        max_position_embeddings=_require_int(raw, "max_position_embeddings", problems, 512),
        type_vocab_size=types,
        layer_norm_eps=float(eps),
        hidden_act=str(act),
        pad_token_id=pad,
        id2label=labels,
        architecture=architecture,
        family=family.name,
        model_type=str(raw["model_type"]),
        embedding_size=embedding_size,
        problem_type=_problem_type(raw, labels, problems),
        labels_named=named,
    )
    if family.offset_positions and config.max_tokens < 2:
        problems.append(f"max_position_embeddings {config.max_position_embeddings} leaves no room after the "
                        f"position offset {config.position_offset} (pad_token_id + 1)")
    if problems:
        raise ModelLoadError(f"{source} is inconsistent: " + "; ".join(problems))
    return config


def _default_labels(count: Any, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        problems.append(f"'num_labels' must be a positive integer (found {count!r}), or name the labels in 'id2label'")
        return ()
    return tuple(f"LABEL_{i}" for i in range(count))


def _parse_labels(raw: Any, problems: list[str]) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        problems.append("'id2label' must be an object mapping indices to label names")
        return ()
    try:
        by_index = {int(k): str(v) for k, v in raw.items()}
    except ValueError:
        problems.append("'id2label' keys must be integers")
        return ()
    if sorted(by_index) != list(range(len(by_index))):
        problems.append(f"'id2label' indices must be 0..{len(by_index) - 1} without gaps")
        return ()
    return tuple(by_index[i] for i in range(len(by_index)))


def read_config(path: Path) -> ModelConfig:
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing: a model directory needs config.json")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path} is not readable JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return parse_config(raw, source=str(path))
