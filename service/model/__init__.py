"""The BERT-family classifier: config, forward pass, weight mapping, loading.

The names are imported on first use, not with the package: the HTTP side of the server reads a model's config and
tokenizer through glassbox.service.model.files and glassbox.service.model.config, and must not load torch on the way (an
HTTP worker process would carry it for nothing)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from glassbox.service.model.bert import BertClassifier
    from glassbox.service.model.config import ModelConfig, parse_config
    from glassbox.service.model.loader import LoadedModel, load_model, save_model

_HOMES = {"BertClassifier": "glassbox.service.model.bert", "ModelConfig": "glassbox.service.model.config",
          "parse_config": "glassbox.service.model.config", "LoadedModel": "glassbox.service.model.loader",
          "load_model": "glassbox.service.model.loader", "save_model": "glassbox.service.model.loader"}

__all__ = ["BertClassifier", "LoadedModel", "ModelConfig", "load_model", "parse_config", "save_model"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'glassbox.service.model' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
