"""The BERT-family classifier: config, forward pass, weight mapping, loading.

The names are imported on first use, not with the package: the HTTP side of the server reads a model's config and
tokenizer through service.model.files and service.model.config, and must not load torch on the way (an HTTP worker
process would carry it for nothing)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.model.bert import BertClassifier
    from service.model.config import ModelConfig, parse_config
    from service.model.loader import LoadedModel, load_model, save_model

_HOMES = {"BertClassifier": "service.model.bert", "ModelConfig": "service.model.config",
          "parse_config": "service.model.config", "LoadedModel": "service.model.loader",
          "load_model": "service.model.loader", "save_model": "service.model.loader"}

__all__ = ["BertClassifier", "LoadedModel", "ModelConfig", "load_model", "parse_config", "save_model"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'service.model' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
