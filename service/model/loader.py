"""Load a model directory (config.json, model.safetensors or its shards, tokenizer.json) into a ready BertClassifier.

Everything that can be wrong with the files is found here, at start-up, and reported as one
ModelLoadError that names the file and the problem (the config and tokenizer checks, which need no torch, are
service/model/files.py's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import save_file

from glassbox.service.model.bert import BertClassifier
from glassbox.service.model.checkpoint import WEIGHTS_FILE, read_tensors
from glassbox.service.model.config import ModelConfig
from glassbox.service.model.files import CONFIG_FILE, TOKENIZER_FILE, describe_model, tokenizer_for
from glassbox.service.model.weights import check_hf_tensors, glassbox_to_hf, hf_to_glassbox
from glassbox.service.tokenizer import TextTokenizer


@dataclass(frozen=True, slots=True)
class LoadedModel:
    path: Path
    config: ModelConfig
    model: BertClassifier  # fp32, on the CPU, in eval mode
    tokenizer_file: Path

    @property
    def labels(self) -> tuple[str, ...]:
        return self.config.id2label

    @property
    def name(self) -> str:
        return self.path.name

    def text_tokenizer(self, max_length: int) -> TextTokenizer:
        return tokenizer_for(self.tokenizer_file, self.config, max_length)


def load_model(directory: str | Path) -> LoadedModel:
    files = describe_model(directory)
    path, config = files.path, files.config
    tensors = check_hf_tensors(read_tensors(path), config, require_head=True, source=str(path))
    model = BertClassifier(config)
    model.load_state_dict({k: v.float() for k, v in hf_to_glassbox(tensors, config).items()}, strict=True)
    model.eval()
    return LoadedModel(path=path, config=config, model=model, tokenizer_file=files.tokenizer_file)


def save_model(directory: str | Path, model: BertClassifier, tokenizer_json: str) -> Path:
    """Write a Hugging Face-compatible BERT classifier directory (transformers can load it too)."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).write_text(json.dumps(model.config.to_hf_dict(), indent=2) + "\n", encoding="utf-8")
    save_file(glassbox_to_hf(model.state_dict(), model.config), str(path / WEIGHTS_FILE))
    (path / TOKENIZER_FILE).write_text(tokenizer_json, encoding="utf-8")
    return path
