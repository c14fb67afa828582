"""Where a model directory keeps its weights, and reading them: one `model.safetensors`, or shards listed in
`model.safetensors.index.json` (what `save_pretrained` writes for large models). Never pickles: a directory with
only `pytorch_model.bin` is refused with the command that converts it (`glassbox model convert DIR`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from glassbox.service.errors import ModelLoadError

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"


@dataclass(frozen=True, slots=True)
class WeightFiles:
    """The safetensors files of a directory and, for shards, which tensor the index puts in which file."""

    files: tuple[Path, ...]
    index: Path | None  # model.safetensors.index.json, when sharded
    weight_map: dict[str, str]  # tensor name -> shard file name ({} when not sharded)


def pickle_only(directory: Path) -> Path | None:
    """The pickled checkpoint a directory holds instead of safetensors, if that is what it holds."""
    if (directory / WEIGHTS_FILE).is_file() or (directory / WEIGHTS_INDEX).is_file():
        return None
    for name in (PICKLE_FILE, PICKLE_INDEX):
        if (directory / name).is_file():
            return directory / name
    return None


def locate(directory: Path) -> WeightFiles:
    """The weight files of `directory`, or one ModelLoadError naming the file and what is wrong with it."""
    pickled = pickle_only(directory)
    if pickled is not None:
        raise ModelLoadError(
            f"{pickled} is a pickled PyTorch checkpoint, which glassbox does not load (unpickling can run code); "
            f"convert it to {WEIGHTS_FILE} with `glassbox model convert {directory}`"
        )
    if (directory / WEIGHTS_FILE).is_file():
        return WeightFiles((directory / WEIGHTS_FILE,), None, {})
    index = directory / WEIGHTS_INDEX
    if not index.is_file():
        raise ModelLoadError(f"{directory / WEIGHTS_FILE} is missing: a model directory needs {WEIGHTS_FILE} "
                             f"(or shards listed in {WEIGHTS_INDEX})")
    weight_map = _read_index(index)
    files = tuple(directory / name for name in dict.fromkeys(weight_map.values()))
    for file in files:
        if not file.is_file():
            raise ModelLoadError(f"{index} lists the shard {file.name}, which is missing from {directory}")
    return WeightFiles(files, index, weight_map)


def _read_index(index: Path) -> dict[str, str]:
    try:
        raw = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{index} is not readable JSON: {exc}") from None
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"{index} has no \"weight_map\" object naming the shard of each tensor")
    for name, file in weight_map.items():
        if not isinstance(file, str) or Path(file).name != file or not file.endswith(".safetensors"):
            raise ModelLoadError(f"{index}: tensor {name!r} points at {file!r}, not a .safetensors file beside it")
    return {str(k): str(v) for k, v in weight_map.items()}


def _check_index(located: WeightFiles, names_by_file: dict[Path, list[str]]) -> None:
    """Each tensor in the shard the index names for it, and every tensor the index lists found."""
    if located.index is None:
        return
    for file, names in names_by_file.items():
        for name in names:
            if located.weight_map.get(name) != file.name:
                raise ModelLoadError(f"{file} holds {name!r}, which {located.index.name} puts in "
                                     f"{located.weight_map.get(name, 'no shard')}")
    absent = sorted(set(located.weight_map) - {name for names in names_by_file.values() for name in names})
    if absent:
        raise ModelLoadError(f"{located.index} lists tensors no shard holds: {', '.join(absent[:6])}")


def read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's weights, on the CPU, whether in one file or in shards."""
    located = locate(directory)
    tensors: dict[str, torch.Tensor] = {}
    names_by_file: dict[Path, list[str]] = {}
    for file in located.files:
        try:
            part = load_file(str(file), device="cpu")
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelLoadError(f"{file} is not a readable safetensors file: {exc}") from None
        names_by_file[file] = list(part)
        _check_finite(file, part)
        tensors.update(part)
    _check_index(located, names_by_file)
    return tensors


def _check_finite(file: Path, tensors: dict[str, torch.Tensor]) -> None:
    """A NaN or an infinity in a weight reaches the scores of every text that touches it: null scores at request
    time, so a damaged checkpoint is refused here. One pass over the weights: ~0.25 s of the ~0.7 s load_model took on
    the default model (22M parameters, a busy 2-core host, 2026-12-03)."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ModelLoadError(f"{file}: tensor {name!r} holds values that are not finite (NaN or infinity); the "
                                 "checkpoint is damaged")


def tensor_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the directory's tensors, read from the safetensors headers without loading any data."""
    located = locate(directory)
    shapes: dict[str, tuple[int, ...]] = {}
    names_by_file: dict[Path, list[str]] = {}
    for file in located.files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                names_by_file[file] = list(handle.keys())
                for name in names_by_file[file]:
                    shapes[name] = tuple(handle.get_slice(name).get_shape())
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelLoadError(f"{file} is not a readable safetensors file: {exc}") from None
    _check_index(located, names_by_file)
    return shapes
