"""Hugging Face tensor names <-> glassbox parameter names for every family, with shape checks that explain themselves.

Checkpoint names are handled without the family's prefix (`bert.`, `roberta.`, ...): a classifier checkpoint puts
its encoder under the prefix and its head at the top level, a bare encoder checkpoint has no prefix at all, and both
read the same once the prefix is stripped.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from glassbox.service.errors import ModelLoadError
from glassbox.service.model.config import ModelConfig, family_named
from glassbox.service.model.families import WeightNames

# Tensors some checkpoints carry that are not weights (buffers recomputed from the config).
IGNORED_SUFFIXES = ("embeddings.position_ids", "embeddings.token_type_ids")
KINDS = ("weight", "bias")


def _names(config: ModelConfig) -> WeightNames:
    return family_named(config.family).names


def _parts(config: ModelConfig, *, with_head: bool) -> dict[str, tuple[str, ...]]:
    """glassbox parameter (without .weight/.bias) -> the checkpoint tensor(s) it is made of (several for qkv)."""
    names = _names(config)
    parts: dict[str, tuple[str, ...]] = {}
    for ours, theirs in names.embeddings.items():
        if ours == "token_type" and config.type_vocab_size == 0:
            continue
        if ours == "project" and not config.embedding_size:
            continue
        parts[f"embeddings.{ours}"] = (theirs,)
    for n in range(config.num_hidden_layers):
        prefix = names.layer.format(n=n)
        parts[f"layers.{n}.qkv"] = tuple(prefix + name for name in names.qkv)
        for ours, theirs in names.layer_parts.items():
            parts[f"layers.{n}.{ours}"] = (prefix + theirs,)
    parts["pooler"] = (names.head["pooler"],)
    if with_head:
        parts["classifier"] = (names.head["classifier"],)
    return parts


def _shape(config: ModelConfig, ours: str, kind: str) -> tuple[int, ...]:
    """The shape of one checkpoint tensor that makes up glassbox parameter `ours` (one third of qkv)."""
    h, i, e = config.hidden_size, config.intermediate_size, config.embedding_width
    module = ours.split(".")[-1]
    rows = {
        "word": config.vocab_size, "position": config.max_position_embeddings, "token_type": config.type_vocab_size,
        "ffn_up": i, "classifier": config.num_labels,
    }
    if ours.startswith("embeddings."):
        if module == "project":
            return (h, e) if kind == "weight" else (h,)
        return (rows[module], e) if module in rows else (e,)
    if kind == "bias" or module.endswith("norm"):
        return (rows.get(module, h),)
    return (rows.get(module, h), i if module == "ffn_down" else h)


def expected_shapes(config: ModelConfig, *, with_head: bool) -> dict[str, tuple[int, ...]]:
    """Every checkpoint tensor name (without the family prefix) and its shape."""
    shapes: dict[str, tuple[int, ...]] = {}
    for ours, theirs in _parts(config, with_head=with_head).items():
        for kind in KINDS:
            if ours.startswith("embeddings.") and kind == "bias" and not ours.endswith(("norm", "project")):
                continue  # embedding tables have no bias
            for name in theirs:
                shapes[f"{name}.{kind}"] = _shape(config, ours, kind)
    return shapes


def strip_prefix(name: str, config: ModelConfig) -> str:
    prefix = family_named(config.family).prefix
    return name[len(prefix):] if name.startswith(prefix) else name


def check_hf_tensors(
    tensors: Mapping[str, Tensor], config: ModelConfig, *, require_head: bool, source: str
) -> dict[str, Tensor]:
    """Validate names and shapes; return the tensors keyed without the family prefix.

    Raises one ModelLoadError that lists every missing, unexpected and misshapen tensor together.
    """
    unused = tuple(name + "." for name in _names(config).unused)  # e.g. a RoBERTa checkpoint's pooler
    stripped = {strip_prefix(k, config): v for k, v in tensors.items() if not k.endswith(IGNORED_SUFFIXES)}
    found = {k: v for k, v in stripped.items() if not (unused and k.startswith(unused))}
    has_head = f"{_names(config).head['classifier']}.weight" in found
    expected = expected_shapes(config, with_head=require_head or has_head)
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    misshapen = [
        f"{name} is {tuple(found[name].shape)}, expected {shape}"
        for name, shape in expected.items()
        if name in found and tuple(found[name].shape) != shape
    ]
    # An integer or boolean tensor would be cast to float and serve numbers that mean nothing (a quantized checkpoint
    # without its scales, a wrong export); half and bfloat16 load as fp32.
    integral = [f"{name} ({found[name].dtype})" for name in expected if name in found
                and not found[name].is_floating_point()]
    problems = []
    if missing:
        problems.append(f"missing tensors: {_short(missing)}")
    if unexpected:
        problems.append(f"unknown tensors: {_short(unexpected)}")
    if misshapen:
        problems.append("wrong shapes: " + _short(misshapen))
    if integral:
        problems.append("not floating point: " + _short(integral))
    if problems:
        hint = ""
        head = _names(config).head["classifier"]
        if any(m.startswith(head + ".") for m in misshapen):
            hint = f" (config.json's id2label names {config.num_labels} labels; the head disagrees)"
        raise ModelLoadError(f"{source} does not match config.json{hint}: " + "; ".join(problems))
    return found


def _short(items: list[str], limit: int = 6) -> str:
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def hf_to_glassbox(tensors: Mapping[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """Checked checkpoint tensors (no prefix) -> a state dict for BertClassifier (the head may be absent)."""
    state: dict[str, Tensor] = {}
    for ours, theirs in _parts(config, with_head=True).items():
        for kind in KINDS:
            if all(f"{name}.{kind}" in tensors for name in theirs):
                # qkv: [3*hidden, hidden] weight / [3*hidden] bias, in query, key, value order.
                state[f"{ours}.{kind}"] = torch.cat([tensors[f"{name}.{kind}"] for name in theirs])
    return state


def glassbox_to_hf(state: Mapping[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """BertClassifier state dict -> the family's ForSequenceClassification checkpoint names (contiguous)."""
    family = family_named(config.family)
    out: dict[str, Tensor] = {}
    for ours, theirs in _parts(config, with_head=True).items():
        for kind in KINDS:
            if f"{ours}.{kind}" not in state:
                continue
            pieces = state[f"{ours}.{kind}"].chunk(len(theirs))
            for name, piece in zip(theirs, pieces, strict=True):
                outside = name.startswith(family.names.outside)
                out[("" if outside else family.prefix) + f"{name}.{kind}"] = piece
    return {k: v.detach().contiguous().cpu() for k, v in out.items()}
