"""Hugging Face BERT tensor names <-> glassbox parameter names, with shape checks that explain themselves."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from service.errors import ModelLoadError
from service.model.config import ModelConfig

# Tensors some checkpoints carry that are not weights (buffers recomputed from the config).
IGNORED_SUFFIXES = ("embeddings.position_ids",)

_EMBEDDINGS = {
    "embeddings.word": "embeddings.word_embeddings",
    "embeddings.position": "embeddings.position_embeddings",
    "embeddings.token_type": "embeddings.token_type_embeddings",
    "embeddings.norm": "embeddings.LayerNorm",
}
_LAYER = {
    "attn_out": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "ffn_up": "intermediate.dense",
    "ffn_down": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
_QKV = ("attention.self.query", "attention.self.key", "attention.self.value")


def expected_shapes(config: ModelConfig, *, with_head: bool) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor name (without the `bert.` prefix for encoder tensors) and its shape."""
    h, i = config.hidden_size, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (config.vocab_size, h),
        "embeddings.position_embeddings.weight": (config.max_position_embeddings, h),
        "embeddings.token_type_embeddings.weight": (config.type_vocab_size, h),
        "embeddings.LayerNorm.weight": (h,),
        "embeddings.LayerNorm.bias": (h,),
    }
    for n in range(config.num_hidden_layers):
        p = f"encoder.layer.{n}."
        for name in (*_QKV, "attention.output.dense"):
            shapes[p + name + ".weight"] = (h, h)
            shapes[p + name + ".bias"] = (h,)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[p + name + ".weight"] = (h,)
            shapes[p + name + ".bias"] = (h,)
        shapes[p + "intermediate.dense.weight"] = (i, h)
        shapes[p + "intermediate.dense.bias"] = (i,)
        shapes[p + "output.dense.weight"] = (h, i)
        shapes[p + "output.dense.bias"] = (h,)
    shapes["pooler.dense.weight"] = (h, h)
    shapes["pooler.dense.bias"] = (h,)
    if with_head:
        shapes["classifier.weight"] = (config.num_labels, h)
        shapes["classifier.bias"] = (config.num_labels,)
    return shapes


def _strip(name: str) -> str:
    return name[len("bert."):] if name.startswith("bert.") else name


def check_hf_tensors(
    tensors: Mapping[str, Tensor], config: ModelConfig, *, require_head: bool, source: str
) -> dict[str, Tensor]:
    """Validate names and shapes; return the tensors keyed without the `bert.` prefix.

    Raises one ModelLoadError that lists every missing, unexpected and misshapen tensor together.
    """
    found = {_strip(k): v for k, v in tensors.items() if not k.endswith(IGNORED_SUFFIXES)}
    has_head = "classifier.weight" in found
    expected = expected_shapes(config, with_head=require_head or has_head)
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    misshapen = [
        f"{name} is {tuple(found[name].shape)}, expected {shape}"
        for name, shape in expected.items()
        if name in found and tuple(found[name].shape) != shape
    ]
    problems = []
    if missing:
        problems.append(f"missing tensors: {_short(missing)}")
    if unexpected:
        problems.append(f"unknown tensors: {_short(unexpected)}")
    if misshapen:
        problems.append("wrong shapes: " + _short(misshapen))
    if problems:
        hint = ""
        if any(m.startswith("classifier.") for m in misshapen):
            hint = f" (config.json's id2label names {config.num_labels} labels; the head disagrees)"
        raise ModelLoadError(f"{source} does not match config.json{hint}: " + "; ".join(problems))
    return found


def _short(items: list[str], limit: int = 6) -> str:
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def hf_to_glassbox(tensors: Mapping[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """Checked HF tensors (no `bert.` prefix) -> a state dict for BertClassifier (head may be absent)."""
    state: dict[str, Tensor] = {}
    for ours, theirs in _EMBEDDINGS.items():
        for kind in ("weight", "bias"):
            if f"{theirs}.{kind}" in tensors:
                state[f"{ours}.{kind}"] = tensors[f"{theirs}.{kind}"]
    for n in range(config.num_hidden_layers):
        p = f"encoder.layer.{n}."
        for kind in ("weight", "bias"):
            # [3*hidden, hidden] weight / [3*hidden] bias, in query, key, value order.
            state[f"layers.{n}.qkv.{kind}"] = torch.cat([tensors[f"{p}{name}.{kind}"] for name in _QKV])
            for ours, theirs in _LAYER.items():
                state[f"layers.{n}.{ours}.{kind}"] = tensors[f"{p}{theirs}.{kind}"]
    for kind in ("weight", "bias"):
        state[f"pooler.{kind}"] = tensors[f"pooler.dense.{kind}"]
        if f"classifier.{kind}" in tensors:
            state[f"classifier.{kind}"] = tensors[f"classifier.{kind}"]
    return state


def glassbox_to_hf(state: Mapping[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """BertClassifier state dict -> Hugging Face BertForSequenceClassification names (contiguous)."""
    out: dict[str, Tensor] = {}
    for ours, theirs in _EMBEDDINGS.items():
        for kind in ("weight", "bias"):
            if f"{ours}.{kind}" in state:
                out[f"bert.{theirs}.{kind}"] = state[f"{ours}.{kind}"]
    for n in range(config.num_hidden_layers):
        p = f"bert.encoder.layer.{n}."
        for kind in ("weight", "bias"):
            for name, part in zip(_QKV, state[f"layers.{n}.qkv.{kind}"].chunk(3), strict=True):
                out[f"{p}{name}.{kind}"] = part
            for ours, theirs in _LAYER.items():
                out[f"{p}{theirs}.{kind}"] = state[f"layers.{n}.{ours}.{kind}"]
    for kind in ("weight", "bias"):
        out[f"bert.pooler.dense.{kind}"] = state[f"pooler.{kind}"]
        out[f"classifier.{kind}"] = state[f"classifier.{kind}"]
    return {k: v.detach().contiguous().cpu() for k, v in out.items()}
