"""`glassbox model info`: what a model directory holds and how well it did on its held-out set."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from glassbox.service.errors import ModelLoadError
from glassbox.service.model.build import EVAL_FILE
from glassbox.service.model.checkpoint import WEIGHTS_FILE
from glassbox.service.model.config import read_config
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.files import CONFIG_FILE, HELDOUT_FILE, TOKENIZER_FILE


def describe(path: Path) -> dict[str, Any]:
    """{"path", "eval", "config", "files"}; "eval" is None for a directory glassbox did not build. A directory that
    `glassbox serve` would refuse (weights or tokenizer.json missing or not matching the config) is a ModelLoadError
    naming every problem: info never describes a model that cannot be served."""
    if not (path / CONFIG_FILE).is_file():
        raise ModelLoadError(f"no model at {path}: build the default one with `glassbox model build`")
    from glassbox.service.model.inspection import inspect_directory  # reads weight headers; imports torch only when run

    inspected = inspect_directory(path)
    if not inspected.servable:
        raise ModelLoadError(f"{path} cannot be served: " + "; ".join(inspected.problems)
                             + f" (`glassbox model inspect {path}` shows the whole report)")
    config = read_config(path / CONFIG_FILE)
    report: dict[str, Any] | None = None
    if (path / EVAL_FILE).is_file():
        try:
            report = json.loads((path / EVAL_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{path / EVAL_FILE} is not readable JSON: {exc}") from None
    files = {name: (path / name).stat().st_size for name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE, EVAL_FILE,
                                                             HELDOUT_FILE) if (path / name).is_file()}
    return {
        "path": str(path),
        "eval": report,
        "config": {
            "architecture": config.architecture,
            "labels": list(config.id2label),
            "layers": config.num_hidden_layers,
            "hidden_size": config.hidden_size,
            "attention_heads": config.num_attention_heads,
            "intermediate_size": config.intermediate_size,
            "max_position_embeddings": config.max_position_embeddings,
            "vocab_size": config.vocab_size,
        },
        "files": files,
    }


def _human(info: dict[str, Any]) -> str:
    config = info["config"]
    lines = [
        f"path          {info['path']}",
        f"labels        {', '.join(config['labels']) or '(none)'}",
        f"encoder       {config['layers']} layers, hidden {config['hidden_size']}, "
        f"{config['attention_heads']} heads, up to {config['max_position_embeddings']} positions",
    ]
    report = info["eval"]
    if report is None:
        lines.append(f"eval          (no {EVAL_FILE}: not built by `glassbox model build`)")
    else:
        lines += [
            f"accuracy      {report.get('accuracy')} on {report.get('n_heldout')} held-out texts "
            f"(trained on {report.get('n_train')}, seed {report.get('seed')}, {report.get('epochs')} epoch(s))",
            f"built         {report.get('date')} in {report.get('train_seconds')}s of training, "
            f"recipe {report.get('recipe')}",
        ]
        sizes = report.get("sizes") or {}
        if sizes:
            lines.append(f"size          {sizes.get('params', 0) / 1e6:.1f}M parameters, "
                         f"{sizes.get('bytes', 0) / 2**20:.1f} MiB of weights")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # The directory as `model inspect` takes it, or as --model as `serve` takes it.
    parser.add_argument("directory", type=Path, nargs="?", default=None,
                        help="model directory (default: the built-in model)")
    parser.add_argument("--model", type=Path, default=None, help="the same, as a flag")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    if args.directory is not None and args.model is not None and args.directory != args.model:
        print("glassbox model info: two directories given (DIR and --model); give one", file=sys.stderr)
        return 2
    path: Path = (args.directory or args.model or default_model_dir()).expanduser()
    try:
        info = describe(path)
    except ModelLoadError as exc:
        print(f"glassbox model info: {exc.message}", file=sys.stderr)
        return 1
    print(json.dumps(info, indent=2) if args.json else _human(info))
    return 0
