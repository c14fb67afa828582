"""A model directory's files, checked without reading the weights: config.json and tokenizer.json.

What the HTTP side needs (the supervisor's start-up check and every HTTP worker of the multi-process layout): none
of it imports torch, so those processes never load it (about 200 MB of resident memory and a second of start-up
each). service/model/loader.py reads the weights on top of this, with the same errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Encoding, Tokenizer

from glassbox.service.errors import ModelLoadError
from glassbox.service.model.config import ModelConfig, read_config
from glassbox.service.tokenizer import TextTokenizer

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
# Held-out texts with their labels (JSON lines): `glassbox model build` writes them; `glassbox bench engine` measures
# accuracy on them and the CPU engine's bf16 gate (service/engines/precision.py) checks bf16 against fp32 on them.
HELDOUT_FILE = "heldout.jsonl"


def tokenizer_for(tokenizer_file: Path, config: ModelConfig, max_length: int) -> TextTokenizer:
    """The model's tokenizer, truncating at `max_length` (never past the positions the model has), padding with its
    pad id, and giving pairs token type ids when the model reads them."""
    return TextTokenizer.from_file(tokenizer_file, max_length, config.max_tokens,
                                   pad_id=config.pad_token_id, token_types=config.uses_token_types)


def check_tokenizer(path: Path, config: ModelConfig) -> None:
    """Parse tokenizer.json now, so a broken one fails at start-up rather than at the first request, and
    make sure every id it can produce has a row in the embedding matrix (else: an index error per request)."""
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a plain Exception for every parse error
        raise ModelLoadError(f"{path} is not a readable tokenizer.json: {exc}") from None
    ids = {i: t for t, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    # The post-processor's special tokens carry ids of their own, which need not be in the vocabulary: encode one
    # text and one pair, as TextTokenizer will (its own padding off), to see them.
    tokenizer.no_padding()
    single, pair = _encoded(tokenizer, "a"), _encoded(tokenizer, "a", "b")
    for encoding in (single, pair):
        if encoding is not None:
            ids.update(zip(encoding.ids, encoding.tokens, strict=True))
    top = max(ids, default=-1)
    if top >= config.vocab_size:
        raise ModelLoadError(
            f"{path} produces token id {top} ({ids[top]!r}) but config.json's vocab_size is {config.vocab_size}: "
            "the tokenizer does not belong to these weights"
        )
    if config.uses_token_types and pair is not None:  # without a pair template, pairs are refused per request
        types = pair.type_ids
        if max(types, default=0) >= config.type_vocab_size:
            raise ModelLoadError(
                f"{path} gives the second text of a pair token type {max(types)}, but config.json's type_vocab_size "
                f"is {config.type_vocab_size}"
            )


def _encoded(tokenizer: Tokenizer, text: str, pair: str | None = None) -> Encoding | None:
    try:
        return tokenizer.encode(text, pair)
    except Exception:  # the Rust side raises a plain Exception (e.g. a pair without a pair template)
        return None


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """A model directory whose config and tokenizer were checked; its weights were not read (HTTP workers of the
    multi-process layout need no more)."""

    path: Path
    config: ModelConfig
    tokenizer_file: Path

    def text_tokenizer(self, max_length: int) -> TextTokenizer:
        return tokenizer_for(self.tokenizer_file, self.config, max_length)


def directory_problem(path: Path) -> str | None:
    """Why `path` cannot be a model directory, or None. A file that exists is named as such: 'does not exist' about
    a path that does sends the operator looking for the wrong mistake (a file given for its directory)."""
    if path.is_dir():
        try:
            (path / CONFIG_FILE).exists()  # EACCES, unlike a missing file, raises: a directory its user cannot search
        except PermissionError:
            return (f"model directory {path} cannot be read: permission denied (glassbox needs read and search "
                    "permission on it and its files)")
        return None
    if path.exists():
        return f"model directory {path} is not a directory (a model is a save_pretrained directory)"
    return f"model directory {path} does not exist"


def describe_model(directory: str | Path) -> ModelFiles:
    """Everything load_model checks but the weights, with the same errors."""
    path = Path(directory).expanduser()
    problem = directory_problem(path)
    if problem is not None:
        raise ModelLoadError(problem)
    config = read_config(path / CONFIG_FILE)
    if config.num_labels == 0:
        raise ModelLoadError(
            f"{path / CONFIG_FILE} has no id2label: glassbox serves classifiers and needs the label names"
        )
    tokenizer_file = path / TOKENIZER_FILE
    if not tokenizer_file.is_file():
        raise ModelLoadError(f"{tokenizer_file} is missing: a model directory needs {TOKENIZER_FILE}")
    check_tokenizer(tokenizer_file, config)
    return ModelFiles(path, config, tokenizer_file)
