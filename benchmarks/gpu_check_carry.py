"""Pack what the GPU check needs but the bare GPU machine lacks into one ignored folder that travels with it.

- `model/`: an fp16 copy of a model directory. The fp32 default model (~90 MB) is over the 64 MiB a working
  tree may carry; in fp16 it is about half. The loader turns it back into fp32 on load, so the check then
  runs weights rounded to fp16 once: fine for graph-vs-eager parity and latency, which compare two engines
  on the same weights, and not a measure of the model's accuracy.
- `pydeps.zip`: pytest and its pure-Python dependencies, from this interpreter, without bytecode, so the
  GPU machine (no pytest, no network) can run the gpu-marked tests. Python imports straight from a zip.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import zipfile
from pathlib import Path

from service.model.loader import TOKENIZER_FILE, load_model, save_model

DEFAULT_DEST = Path("out/gpu-carry")  # under /out/, which .gitignore already ignores
PYTEST_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py")


def write_fp16_model(source: Path, dest: Path) -> int:
    """Write `source` as fp16 safetensors under `dest`; returns the bytes written."""
    loaded = load_model(source)
    tokenizer_json = (source / TOKENIZER_FILE).read_text(encoding="utf-8")
    if dest.exists():
        shutil.rmtree(dest)
    save_model(dest, loaded.model.half(), tokenizer_json)
    evaluation = source / "eval.json"
    if evaluation.is_file():
        shutil.copyfile(evaluation, dest / "eval.json")
    (dest / "CARRIED.json").write_text(json.dumps({"source": str(source), "weights": "fp16 copy"}) + "\n")
    return sum(f.stat().st_size for f in dest.iterdir())


def _package_files(name: str) -> list[tuple[Path, str]]:
    """(file on disk, name inside the zip) for a package or a single-module distribution."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise SystemExit(f"prepare-carry: {name} is not importable here; install the dev extra first")
    if spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations)))
        return [(f, str(f.relative_to(root.parent))) for f in sorted(root.rglob("*"))
                if f.is_file() and "__pycache__" not in f.parts]
    assert spec.origin is not None
    origin = Path(spec.origin)
    return [(origin, origin.name)]


def write_pydeps(dest: Path) -> int:
    zip_path = dest / "pydeps.zip"
    with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in PYTEST_PACKAGES:
            for path, arcname in _package_files(name):
                archive.write(path, arcname)
    return zip_path.stat().st_size


def prepare(model: Path | None, dest: Path) -> int:
    dest.mkdir(parents=True, exist_ok=True)
    total = 0
    if model is not None:
        written = write_fp16_model(model, dest / "model")
        print(f"wrote fp16 model copy: {dest / 'model'} ({written / 2**20:.1f} MiB)")
        total += written
    else:
        print("no --model given: carrying no model (the check will skip the default model)")
    zipped = write_pydeps(dest)
    print(f"wrote pytest bundle: {dest / 'pydeps.zip'} ({zipped / 2**20:.1f} MiB)")
    total += zipped
    print(f"carry total {total / 2**20:.1f} MiB; name '{dest}' in the device tool's carry list")
    return 0
