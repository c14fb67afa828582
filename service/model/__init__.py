"""The BERT-family classifier: config, forward pass, weight mapping, loading."""

from service.model.bert import BertClassifier
from service.model.config import ModelConfig, parse_config
from service.model.loader import LoadedModel, load_model, save_model

__all__ = ["BertClassifier", "LoadedModel", "ModelConfig", "load_model", "parse_config", "save_model"]
