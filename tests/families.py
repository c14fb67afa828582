"""Tiny random classifiers of every family, built with transformers' own classes and saved with `save_pretrained`,
with a tokenizer of the family's kind trained here with the `tokenizers` library (no hub, no downloads).

| case | classes | tokenizer |
| --- | --- | --- |
| bert | BertConfig, BertForSequenceClassification | WordPiece, [CLS] A [SEP] B [SEP], type ids 0/1 |
| distilbert | DistilBertConfig, DistilBertForSequenceClassification | the same WordPiece |
| roberta | RobertaConfig, RobertaForSequenceClassification | byte-level BPE, <s> A </s></s> B </s> |
| xlm-roberta | XLMRobertaConfig, XLMRobertaForSequenceClassification | Unigram with Metaspace (SentencePiece's kind) |
| camembert | CamembertConfig, CamembertForSequenceClassification | the same Unigram |
| electra | ElectraConfig (embedding_size 16 < hidden 32), ElectraForSequenceClassification | the WordPiece |
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tests.helpers import WORDS, tiny_tokenizer_json

FAMILY_CASES = ("bert", "distilbert", "roberta", "xlm-roberta", "camembert", "electra")
HEADS = {
    "single": ("single_label_classification", ("negative", "positive", "neutral")),
    "multi": ("multi_label_classification", ("toxic", "insult", "threat", "obscene")),
    "regression": ("regression", ("LABEL_0",)),
}
CORPUS = [
    *WORDS,
    "the movie was very good", "a great film with a boring plot", "worst acting and a slow ending",
    "le film était très bien", "une histoire longue et ennuyeuse", "café crème, déjà vu", "naïve façade",
    "der Film war sehr gut", "el final fue malo", "مرحبا بالعالم", "good 😀 film", "sad music, funny cast",
    "what is deep learning?", "deep learning is a kind of machine learning", "paris is the capital of france",
]
MAX_POSITIONS = 64


def _roberta_specials() -> list[str]:
    return ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


@functools.cache
def byte_level_bpe_json() -> str:
    """RoBERTa's kind of tokenizer: byte-level BPE, <s>=0 <pad>=1 </s>=2, pairs as <s> A </s></s> B </s>."""
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=_roberta_specials(), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 3, trainer=trainer)
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True,
                                                            add_prefix_space=False)
    return tokenizer.to_str()


@functools.cache
def unigram_json() -> str:
    """XLM-RoBERTa's and CamemBERT's kind: a SentencePiece-style Unigram model with Metaspace word boundaries."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=_roberta_specials(), unk_token="<unk>",
                                      show_progress=False)
    tokenizer.train_from_iterator(CORPUS * 3, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    return tokenizer.to_str()


def tokenizer_json(case: str) -> str:
    if case == "roberta":
        return byte_level_bpe_json()
    if case in ("xlm-roberta", "camembert"):
        return unigram_json()
    return tiny_tokenizer_json()


@dataclass(frozen=True)
class Geometry:
    hidden: int = 32
    layers: int = 2
    heads: int = 4
    intermediate: int = 64
    positions: int = MAX_POSITIONS  # usable positions (RoBERTa-style models get 2 more for their offset)


TINY = Geometry()
MINILM = Geometry(hidden=384, layers=6, heads=12, intermediate=1536, positions=512)  # the default model's shape


def _common(case: str, vocab: int, problem: str, labels: tuple[str, ...], size: Geometry) -> dict[str, Any]:
    roberta_like = case in ("roberta", "xlm-roberta", "camembert")
    values: dict[str, Any] = {
        "vocab_size": vocab, "id2label": dict(enumerate(labels)), "label2id": {n: i for i, n in enumerate(labels)},
        "problem_type": problem, "pad_token_id": 1 if roberta_like else 0,
    }
    if case == "distilbert":
        return {**values, "dim": size.hidden, "n_layers": size.layers, "n_heads": size.heads,
                "hidden_dim": size.intermediate, "max_position_embeddings": size.positions}
    values.update(hidden_size=size.hidden, num_hidden_layers=size.layers, num_attention_heads=size.heads,
                  intermediate_size=size.intermediate,
                  max_position_embeddings=size.positions + (2 if roberta_like else 0))
    if roberta_like:
        values.update(type_vocab_size=1, bos_token_id=0, eos_token_id=2)
    if case == "electra":
        values.update(embedding_size=size.hidden // 2)  # smaller than hidden: the projection is exercised
    return values


def reference_model(case: str, head: str = "single", seed: int = 0, size: Geometry = TINY) -> torch.nn.Module:
    """A transformers classifier of the family with random weights, every tensor perturbed so that a mapping mistake
    (a bias, a LayerNorm, a swapped projection) changes the logits."""
    import transformers

    classes = {
        "bert": ("BertConfig", "BertForSequenceClassification"),
        "distilbert": ("DistilBertConfig", "DistilBertForSequenceClassification"),
        "roberta": ("RobertaConfig", "RobertaForSequenceClassification"),
        "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaForSequenceClassification"),
        "camembert": ("CamembertConfig", "CamembertForSequenceClassification"),
        "electra": ("ElectraConfig", "ElectraForSequenceClassification"),
    }
    config_class, model_class = (getattr(transformers, name) for name in classes[case])
    problem, labels = HEADS[head]
    vocab = Tokenizer.from_str(tokenizer_json(case)).get_vocab_size()
    torch.manual_seed(seed)
    model: torch.nn.Module = model_class(config_class(**_common(case, vocab, problem, labels, size)))
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return model.eval()


@dataclass(frozen=True)
class FamilyModel:
    case: str
    head: str
    path: Path


def save_family_model(path: Path, case: str, head: str = "single", seed: int = 0, size: Geometry = TINY,
                      **save: Any) -> FamilyModel:
    """`save_pretrained` of the reference model and of its tokenizer (a PreTrainedTokenizerFast) into `path`.
    `save` goes to the model's save_pretrained (e.g. max_shard_size for a sharded checkpoint)."""
    from transformers import PreTrainedTokenizerFast

    model = reference_model(case, head, seed, size)
    model.save_pretrained(str(path), **save)  # type: ignore[operator]
    wordpiece = case in ("bert", "distilbert", "electra")
    specials: dict[str, str] = (
        {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]"}
        if wordpiece else
        {"bos_token": "<s>", "cls_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "pad_token": "<pad>",
         "unk_token": "<unk>", "mask_token": "<mask>"}
    )
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if case in ("bert", "electra") else [])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer_json(case)),
                                        model_input_names=names, model_max_length=size.positions, **specials)
    tokenizer.save_pretrained(str(path))
    return FamilyModel(case, head, path)
