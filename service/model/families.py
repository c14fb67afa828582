"""The model families glassbox serves through one forward pass, and the little that differs between them.

Every family here is a post-LayerNorm BERT-style encoder read at its first token, followed by a head of the same
shape: dense (hidden -> hidden), an activation, dense (hidden -> labels). What differs is small and listed per
family: the checkpoint's tensor names, whether token type ids reach the embeddings, where position ids start, an
embedding projection, and the head's activation.

| family | model_type | quirks |
| --- | --- | --- |
| bert | bert | pooler (dense + tanh) then `classifier` |
| distilbert | distilbert | no token types; own names (`q_lin`, `sa_layer_norm`, ...); `pre_classifier` + ReLU head |
| roberta | roberta, xlm-roberta, camembert | positions start at `pad_token_id + 1`; one token type; dense-tanh-dense |
| electra | electra | `embeddings_project` when embedding_size != hidden_size; dense-GELU-dense head |
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

HeadActivation = Literal["tanh", "relu", "gelu"]


@dataclass(frozen=True, slots=True)
class WeightNames:
    """Checkpoint tensor names (without `.weight`/`.bias`, and without the family's prefix) of glassbox's modules."""

    embeddings: dict[str, str]  # ours -> theirs: word, position, token_type (optional), norm, project (optional)
    layer: str  # the prefix of encoder layer n, with {n}
    qkv: tuple[str, str, str]  # query, key, value projections inside a layer, fused into one matrix by glassbox
    layer_parts: dict[str, str]  # ours -> theirs inside a layer
    head: dict[str, str]  # "pooler" (dense) and "classifier" (out) -> theirs
    outside: tuple[str, ...]  # head tensors that sit at the top level of the checkpoint, not under the prefix
    unused: tuple[str, ...] = ()  # tensors a checkpoint of this family may hold that the classifier never reads


_BERT_EMBEDDINGS = {
    "word": "embeddings.word_embeddings",
    "position": "embeddings.position_embeddings",
    "token_type": "embeddings.token_type_embeddings",
    "norm": "embeddings.LayerNorm",
}
_BERT_LAYER = {
    "attn_out": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "ffn_up": "intermediate.dense",
    "ffn_down": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
_BERT_QKV = ("attention.self.query", "attention.self.key", "attention.self.value")
_DENSE_OUT_HEAD = {"pooler": "classifier.dense", "classifier": "classifier.out_proj"}


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.json `model_type` values
    classifiers: tuple[str, ...]  # `architectures` glassbox serves
    encoder: str  # the bare encoder's architecture (no head: loadable, not servable)
    prefix: str  # the checkpoint's prefix of encoder tensors in a classifier ("bert.")
    head_activation: HeadActivation
    token_types: bool  # token type ids (segment A / B of a pair) reach the embeddings
    offset_positions: bool  # position ids start at pad_token_id + 1 (fairseq's convention)
    names: WeightNames = field(repr=False)


FAMILIES: tuple[Family, ...] = (
    Family(
        name="bert", model_types=("bert",), classifiers=("BertForSequenceClassification",), encoder="BertModel",
        prefix="bert.", head_activation="tanh", token_types=True, offset_positions=False,
        names=WeightNames(_BERT_EMBEDDINGS, "encoder.layer.{n}.", _BERT_QKV, _BERT_LAYER,
                          {"pooler": "pooler.dense", "classifier": "classifier"}, outside=("classifier",)),
    ),
    Family(
        name="distilbert", model_types=("distilbert",), classifiers=("DistilBertForSequenceClassification",),
        encoder="DistilBertModel", prefix="distilbert.", head_activation="relu", token_types=False,
        offset_positions=False,
        names=WeightNames(
            {k: v for k, v in _BERT_EMBEDDINGS.items() if k != "token_type"},
            "transformer.layer.{n}.",
            ("attention.q_lin", "attention.k_lin", "attention.v_lin"),
            {"attn_out": "attention.out_lin", "attn_norm": "sa_layer_norm", "ffn_up": "ffn.lin1",
             "ffn_down": "ffn.lin2", "ffn_norm": "output_layer_norm"},
            {"pooler": "pre_classifier", "classifier": "classifier"},
            outside=("pre_classifier", "classifier"),
        ),
    ),
    Family(
        name="roberta", model_types=("roberta", "xlm-roberta", "camembert"),
        classifiers=("RobertaForSequenceClassification", "XLMRobertaForSequenceClassification",
                     "CamembertForSequenceClassification"),
        encoder="RobertaModel", prefix="roberta.", head_activation="tanh", token_types=False, offset_positions=True,
        names=WeightNames(_BERT_EMBEDDINGS, "encoder.layer.{n}.", _BERT_QKV, _BERT_LAYER, _DENSE_OUT_HEAD,
                          outside=("classifier.",), unused=("pooler.dense",)),
    ),
    Family(
        name="electra", model_types=("electra",), classifiers=("ElectraForSequenceClassification",),
        encoder="ElectraModel", prefix="electra.", head_activation="gelu", token_types=True, offset_positions=False,
        names=WeightNames({**_BERT_EMBEDDINGS, "project": "embeddings_project"}, "encoder.layer.{n}.", _BERT_QKV,
                          _BERT_LAYER, _DENSE_OUT_HEAD, outside=("classifier.",)),
    ),
)


def family_of(model_type: object) -> Family | None:
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    return None


def supported_summary() -> str:
    """One line naming every supported model_type and classifier architecture, for error messages."""
    types = ", ".join(t for f in FAMILIES for t in f.model_types)
    archs = ", ".join(a for f in FAMILIES for a in f.classifiers)
    return f"supported model_type values: {types}; classifier architectures: {archs}"
