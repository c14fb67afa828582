"""Tiny random models and tokenizers, built in the test run (no downloads, no hub)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from glassbox.service.model.bert import BertClassifier
from glassbox.service.model.config import parse_config
from glassbox.service.model.loader import save_model

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the a an and or but not very good bad great awful movie film plot actor acting story boring fun "
    "love hate best worst slow fast funny sad long short music scene ending script cast director"
).split()


def tiny_tokenizer_json() -> str:
    """A real BERT-style WordPiece tokenizer (lowercasing, accent stripping, [CLS] ... [SEP])."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab_list = SPECIALS + WORDS + letters + ["##" + c for c in letters] + list("0123456789.,!?'-")
    vocab = {token: i for i, token in enumerate(dict.fromkeys(vocab_list))}
    tokenizer = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True, clean_text=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer.to_str()


def tiny_config(**overrides: Any) -> dict[str, Any]:
    vocab_size = Tokenizer.from_str(tiny_tokenizer_json()).get_vocab_size()
    raw: dict[str, Any] = {
        "model_type": "bert",
        "architectures": ["BertForSequenceClassification"],
        "vocab_size": vocab_size,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "hidden_act": "gelu",
        "pad_token_id": 0,
        "id2label": {"0": "negative", "1": "positive", "2": "neutral"},
    }
    raw.update(overrides)
    return raw


def make_tiny_model_dir(path: Path, seed: int = 0, **config_overrides: Any) -> Path:
    """Write a complete, loadable model directory with random weights (std 0.2 so logits differ)."""
    model = BertClassifier(parse_config(tiny_config(**config_overrides)))
    model.init_weights(torch.Generator().manual_seed(seed), std=0.2)
    return save_model(path, model, tiny_tokenizer_json())


def with_heldout_file(model_dir: Path, path: Path, texts: int, labels: int = 3) -> Path:
    """A copy of `model_dir` at `path` with a heldout.jsonl of `texts` random labelled texts (label i % `labels`),
    as `glassbox model build` writes one: what bench engine and the CPU's bf16 gate read."""
    import json
    import shutil

    import numpy as np

    shutil.copytree(model_dir, path)
    rng = np.random.default_rng(0)
    lines = [json.dumps({"text": " ".join(rng.choice(WORDS, int(rng.integers(1, 20)))), "label": i % labels})
             for i in range(texts)]
    (path / "heldout.jsonl").write_text("\n".join(lines) + "\n")
    return path
