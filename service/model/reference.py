"""What a model answers on texts like the ones it should see: its reference distributions, and how far the answers
served lately are from them (drift).

A reference is counted with the same bins the server's prediction metrics use (telemetry/predictions.py): the
predicted labels, the top score of each answer (or a regression head's output), and the tokens of each text.
`glassbox model build` writes one for the built-in model from its held-out split; `glassbox model reference DIR
--texts FILE` writes one for any model from texts its owner chooses. The file is `reference.json` in the model
directory. Drift is the population stability index (PSI) between a window of served answers and the reference,
per distribution: 0 for the same shares, ~0.1 a small change, 0.25 and more a shift worth a look.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from glassbox.service.errors import ModelLoadError
from glassbox.service.types import FloatArray, IntArray, ProblemType

REFERENCE_FILE = "reference.json"
FORMAT = 1
# The bins, shared with the metrics: the top score of a softmax head is at least 1/labels, so fine steps from 0.5.
SCORE_BOUNDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.925, 0.95, 0.975, 0.99, 0.999,
                1.0)
REGRESSION_BOUNDS = (-100.0, -10.0, -5.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 100.0)
LENGTH_BOUNDS = (4.0, 8.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0, 384.0, 512.0)
MULTI_LABEL_THRESHOLD = 0.5
PSI_SMOOTHING = 0.5  # added to every bin's count on both sides, so that an empty bin does not make the index infinite


def binned(values: Any, bounds: Sequence[float]) -> IntArray:
    """Counts per bin, Prometheus's `le` bins (a value goes to the first bound at or above it), +Inf last."""
    edges = np.asarray(bounds, dtype=np.float64)
    index = np.searchsorted(edges, np.asarray(values, dtype=np.float64), side="left")
    counts: IntArray = np.bincount(index, minlength=len(edges) + 1).astype(np.int64)
    return counts


@dataclass(frozen=True, slots=True)
class Counted:
    """One batch's (or a whole reference's) answers, binned. `labels` is empty for a regression head, `outputs`
    for a classifier; `top` holds the top scores themselves (for the score histogram's sum)."""

    labels: IntArray  # [labels] answers per predicted label
    score: IntArray  # [len(SCORE_BOUNDS) + 1]
    outputs: IntArray  # [len(REGRESSION_BOUNDS) + 1]
    length: IntArray  # [len(LENGTH_BOUNDS) + 1]
    top: FloatArray  # [rows] each answer's top score, or a regression head's output


def count(logits: FloatArray, lengths: IntArray | None, problem: ProblemType) -> Counted:
    """Bin a batch of answers: a handful of numpy calls, whatever the batch size."""
    from glassbox.service.classification import probabilities

    empty = np.zeros(0, dtype=np.int64)
    length = binned(lengths, LENGTH_BOUNDS) if lengths is not None else np.zeros(len(LENGTH_BOUNDS) + 1, np.int64)
    if problem == "regression":
        outputs = logits[:, 0].astype(np.float32)  # [rows]
        return Counted(empty, empty, binned(outputs, REGRESSION_BOUNDS), length, outputs)
    probs = probabilities(logits, problem)  # [rows, labels]
    top = probs.max(axis=1)  # [rows]
    if problem == "multi_label_classification":
        per_label = (probs >= MULTI_LABEL_THRESHOLD).sum(axis=0).astype(np.int64)  # [labels]
    else:
        per_label = np.bincount(probs.argmax(axis=1), minlength=probs.shape[1]).astype(np.int64)  # [labels]
    return Counted(per_label, binned(top, SCORE_BOUNDS), empty, length, top)


def psi(window: Any, reference: Any) -> float:
    """The population stability index of the shares in `window` against those in `reference` (counts per bin)."""
    observed = np.asarray(window, dtype=np.float64) + PSI_SMOOTHING
    expected = np.asarray(reference, dtype=np.float64) + PSI_SMOOTHING
    p, q = observed / observed.sum(), expected / expected.sum()
    return float(((p - q) * np.log(p / q)).sum())


@dataclass(frozen=True, slots=True)
class Reference:
    source: str  # where its texts came from, for people
    texts: int
    problem: ProblemType
    labels: tuple[str, ...]
    distributions: dict[str, tuple[int, ...]]  # "labels" | "score" | "output" | "length" -> counts per bin

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "source": self.source, "texts": self.texts, "problem": self.problem,
                "labels": list(self.labels), "score_bounds": list(SCORE_BOUNDS),
                "output_bounds": list(REGRESSION_BOUNDS), "length_bounds": list(LENGTH_BOUNDS),
                "distributions": {name: list(values) for name, values in self.distributions.items()}}


def reference_of(counted: Counted, texts: int, problem: ProblemType, labels: Sequence[str], source: str) -> Reference:
    distributions = {"length": tuple(int(v) for v in counted.length)}
    if problem == "regression":
        distributions["output"] = tuple(int(v) for v in counted.outputs)
    else:
        distributions["labels"] = tuple(int(v) for v in counted.labels)
        distributions["score"] = tuple(int(v) for v in counted.score)
    return Reference(source, texts, problem, tuple(labels), distributions)


def read_reference(directory: Path) -> Reference | None:
    """The model directory's reference; None when it has none. A file that does not match this model or these bins
    is a ModelLoadError naming what is wrong (the server then says so and takes its reference from traffic)."""
    path = directory / REFERENCE_FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("format") != FORMAT:
            raise ValueError(f"format {raw.get('format')!r}, this glassbox reads {FORMAT}")
        if (raw["score_bounds"], raw["output_bounds"], raw["length_bounds"]) != (
                list(SCORE_BOUNDS), list(REGRESSION_BOUNDS), list(LENGTH_BOUNDS)):
            raise ValueError("its bins are not this glassbox's; write it again with `glassbox model reference`")
        distributions = {str(k): tuple(int(x) for x in v) for k, v in raw["distributions"].items()}
        reference = Reference(str(raw["source"]), int(raw["texts"]), raw["problem"], tuple(raw["labels"]),
                              distributions)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelLoadError(f"{path} cannot be read as a reference: {exc}") from None
    sizes = {"score": len(SCORE_BOUNDS) + 1, "output": len(REGRESSION_BOUNDS) + 1, "length": len(LENGTH_BOUNDS) + 1,
             "labels": len(reference.labels)}
    for name, values in reference.distributions.items():
        if name not in sizes or len(values) != sizes[name] or min(values, default=0) < 0:
            raise ModelLoadError(f"{path}: distribution {name!r} does not have {sizes.get(name)} counts of 0 or more")
    return reference


def write_reference(directory: Path, reference: Reference) -> Path:
    path = directory / REFERENCE_FILE
    path.write_text(json.dumps(reference.to_json(), indent=1) + "\n", encoding="utf-8")
    return path


def compute_reference(model_dir: Path, texts: Sequence[str], source: str, *, batch_size: int = 32) -> Reference:
    """Run the model (on the CPU, in fp32, glassbox's own engine) over `texts` and bin its answers."""
    from glassbox.service.engines.factory import build_engine
    from glassbox.service.model.loader import load_model
    from glassbox.service.settings import Settings
    from glassbox.service.tokenizer import TextTokenizer

    if not texts:
        raise ModelLoadError("no texts to take a reference from")
    loaded = load_model(model_dir)
    settings = Settings().replace(cpu_dtype="fp32", quantize="none")
    tokenizer = TextTokenizer.from_file(loaded.tokenizer_file, settings.max_length,
                                        loaded.config.max_position_embeddings)
    engine = build_engine(loaded, settings, "cpu", tokenizer.max_length)
    problem = loaded.config.problem_type
    total: Counted | None = None
    for start in range(0, len(texts), batch_size):
        tokens = tokenizer.encode(list(texts[start:start + batch_size]))
        counted = count(engine.run(tokens).logits, tokens.lengths, problem)
        total = counted if total is None else Counted(
            total.labels + counted.labels, total.score + counted.score, total.outputs + counted.outputs,
            total.length + counted.length, np.zeros(0, dtype=np.float32))
    assert total is not None
    return reference_of(total, len(texts), problem, loaded.labels, source)


def read_texts(path: Path, limit: int) -> list[str]:
    """Up to `limit` texts from a file: JSON lines with a "text" field (as heldout.jsonl), or one text per line."""
    texts: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if line.lstrip().startswith("{"):
                try:
                    text = json.loads(line)["text"]
                except (ValueError, KeyError, TypeError):
                    raise ModelLoadError(f"{path}:{number}: a JSON line needs a \"text\" string") from None
                if not isinstance(text, str):
                    raise ModelLoadError(f"{path}:{number}: \"text\" is not a string")
                texts.append(text)
            else:
                texts.append(line)
            if len(texts) >= limit:
                break
    return texts


def describe(reference: Reference | None) -> str:
    if reference is None:
        return f"none (no {REFERENCE_FILE}: the server takes one from the first texts it serves)"
    return f"{reference.texts} texts from {reference.source}"


# -- glassbox model reference ----------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path, help="the model directory; reference.json is written there")
    parser.add_argument("--texts", type=Path, required=True,
                        help="texts like those the model should see: JSON lines with a \"text\" field, or one text a "
                             "line")
    parser.add_argument("--limit", type=int, default=10000, help="read at most this many texts (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    if args.limit < 1:
        print("glassbox model reference: --limit must be at least 1", file=sys.stderr)
        return 2
    try:
        texts = read_texts(args.texts, args.limit)
        reference = compute_reference(args.directory, texts, args.texts.name)
        path = write_reference(args.directory, reference)
    except (ModelLoadError, OSError) as exc:
        print(f"glassbox model reference: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 1
    shares = ""
    if "labels" in reference.distributions:
        counts = reference.distributions["labels"]
        total = sum(counts) or 1
        shares = ", ".join(f"{label} {count / total:.1%}" for label, count in zip(reference.labels, counts,
                                                                                  strict=True))
    print(f"wrote {path}: {reference.texts} texts" + (f"; answers {shares}" if shares else ""))
    return 0
