"""`glassbox model convert DIR`: a pickled `pytorch_model.bin` (or its shards) -> `model.safetensors`, safely.

The checkpoint is read with `torch.load(..., weights_only=True)`, which unpickles tensors and plain containers only
and refuses anything that would run code. The tensors are written to `model.safetensors` beside it (atomically:
a temporary file renamed into place), the pickle is left where it is, and the directory is then checked as
`glassbox serve` would load it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from glassbox.service.errors import ModelLoadError
from glassbox.service.model.checkpoint import PICKLE_FILE, PICKLE_INDEX, WEIGHTS_FILE, WEIGHTS_INDEX
from glassbox.service.model.files import directory_problem


def _pickles(directory: Path) -> list[Path]:
    index = directory / PICKLE_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted({str(name) for name in weight_map.values()})
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelLoadError(f"{index} does not list its shards in a \"weight_map\": {exc}") from None
        return [directory / name for name in names]
    if (directory / PICKLE_FILE).is_file():
        return [directory / PICKLE_FILE]
    raise ModelLoadError(f"{directory} has no {PICKLE_FILE} (nor {PICKLE_INDEX}) to convert")


def read_pickled(file: Path) -> dict[str, torch.Tensor]:
    """One pickled state dict, loaded with weights_only=True; anything but a mapping of names to tensors is refused."""
    if not file.is_file():
        raise ModelLoadError(f"{file} is missing")
    try:
        loaded = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError, ... for bad or unsafe files
        raise ModelLoadError(f"{file} cannot be read safely (weights_only=True): {exc}") from None
    if not isinstance(loaded, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                               for k, v in loaded.items()):
        raise ModelLoadError(f"{file} does not hold a state dict (a mapping of tensor names to tensors)")
    return loaded


def convert(directory: Path, *, force: bool = False) -> Path:
    """Write `directory/model.safetensors` from its pickled checkpoint; returns the new file."""
    problem = directory_problem(directory)
    if problem is not None:
        raise ModelLoadError(problem)
    target = directory / WEIGHTS_FILE
    if (target.exists() or (directory / WEIGHTS_INDEX).exists()) and not force:
        raise ModelLoadError(f"{directory} already has safetensors weights; pass --force to replace {WEIGHTS_FILE}")
    tensors: dict[str, torch.Tensor] = {}
    for file in _pickles(directory):
        for name, tensor in read_pickled(file).items():
            if name in tensors:
                raise ModelLoadError(f"{file} holds {name!r} again: the shards overlap")
            # A copy of its own: tied weights share storage in a pickle, and safetensors refuses shared tensors.
            tensors[name] = tensor.detach().contiguous().clone()
    if not tensors:
        raise ModelLoadError(f"{directory}'s pickled checkpoint holds no tensors")
    handle, scratch = tempfile.mkstemp(prefix=".model.", suffix=".safetensors.tmp", dir=directory)
    os.close(handle)
    try:
        save_file(tensors, scratch, metadata={"format": "pt"})
        os.replace(scratch, target)
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    if force and (directory / WEIGHTS_INDEX).exists():
        (directory / WEIGHTS_INDEX).unlink()  # the shards it lists would otherwise be read instead
    return target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path, help="model directory holding pytorch_model.bin (or its shards)")
    parser.add_argument("--force", action="store_true", help="replace existing safetensors weights")


def run(args: argparse.Namespace) -> int:
    from glassbox.service.model.inspection import inspect_directory

    directory: Path = args.directory.expanduser()
    try:
        written = convert(directory, force=args.force)
    except ModelLoadError as exc:
        print(f"glassbox model convert: {exc.message}", file=sys.stderr)
        return 1
    print(f"wrote {written} ({written.stat().st_size / 2**20:.1f} MiB); the pickle was left in place")
    report = inspect_directory(directory)
    if not report.servable:
        print("but the directory is not servable yet: " + "; ".join(report.problems), file=sys.stderr)
        return 1
    print(f"servable: {report.family} {report.problem_type}, {len(report.labels)} labels")
    return 0
