"""Pack what the GPU check needs but the bare GPU machine lacks into one ignored folder that travels with it.

- `model/`: an fp16 copy of a model directory. The fp32 default model (~90 MB) is over the 64 MiB a working
  tree may carry; in fp16 it is about half. The loader turns it back into fp32 on load, so the check then
  runs weights rounded to fp16 once: fine for graph-vs-eager parity and latency, which compare two engines
  on the same weights, and not a measure of the model's accuracy.
- `pydeps.zip`: pytest and its pure-Python dependencies, from this interpreter, without bytecode, so the
  GPU machine (no pytest, no network) can run the gpu-marked tests. Python imports straight from a zip.
- `wheels/` (`--serve-deps`): what the end-to-end server check (gpu_check_serve.py) imports beyond what the GPU
  host has, as wheels for ITS Python (`--python`, default 3.12; compiled ones like msgspec and httptools must match
  it), downloaded with pip. Kept packed (about a third of their unpacked size: uvloop alone unpacks to 16 MB); the
  check unpacks them into a temporary folder on the GPU host. Which distributions: those a fresh interpreter loads
  when it imports the server, its telemetry, uvicorn's runtime modules and the load generator, plus their declared
  requirements, less what the host has (torch and its requirements, numpy, tokenizers, safetensors, nvidia-ml-py,
  pytest).
- `tools/` (`--serve-deps`, where `wrk` is installed here): the `wrk` binary and the LuaJIT library it links, which a
  bare GPU image lacks, for scripts/gpu-serving.sh. The rest of what wrk links (libc, OpenSSL) is on any host that
  runs Python.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from glassbox.service.model.files import TOKENIZER_FILE
from glassbox.service.model.loader import load_model, save_model

DEFAULT_DEST = Path("out/gpu-carry")  # under /out/, which .gitignore already ignores
PYTEST_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py")
# What a fresh interpreter imports to run the e2e server check (the server, its telemetry, uvicorn's runtime
# modules, the load generator).
SERVE_IMPORTS = ("glassbox.service.server", "glassbox.service.app", "glassbox.telemetry",
                 "glassbox.chaos.loadgen.generator", "uvicorn.protocols.http.httptools_impl",
                 "uvicorn.protocols.http.h11_impl", "uvicorn.lifespan.on", "uvicorn.loops.auto", "uvloop")
# Distributions the GPU host has already (torch's own requirements are added at run time).
ON_THE_HOST = {"torch", "numpy", "tokenizers", "safetensors", "nvidia-ml-py", "pytest", "pluggy", "iniconfig",
               "packaging", "pygments", "glassbox-serve", "setuptools", "pip"}


def write_fp16_model(source: Path, dest: Path) -> int:
    """Write `source` as fp16 safetensors under `dest`; returns the bytes written."""
    loaded = load_model(source)
    tokenizer_json = (source / TOKENIZER_FILE).read_text(encoding="utf-8")
    if dest.exists():
        shutil.rmtree(dest)
    save_model(dest, loaded.model.half(), tokenizer_json)
    for name in ("eval.json", "heldout.jsonl"):  # heldout.jsonl: the text mix benchmarks.frontend and serving send
        if (source / name).is_file():
            shutil.copyfile(source / name, dest / name)
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


def write_tools(dest: Path) -> int:
    """Copy `wrk` and the LuaJIT library it links into dest/tools; returns the bytes written (0 without wrk here)."""
    wrk = shutil.which("wrk")
    if wrk is None:
        return 0
    tools = dest / "tools"
    shutil.rmtree(tools, ignore_errors=True)
    tools.mkdir(parents=True)
    shutil.copy2(wrk, tools / "wrk")
    linked = subprocess.run(["ldd", wrk], capture_output=True, text=True, check=True).stdout
    for name, path in re.findall(r"^\s*(libluajit\S*)\s+=>\s+(\S+)", linked, flags=re.MULTILINE):
        shutil.copyfile(path, tools / name)  # under the name wrk asks for, whatever link it resolves through
    return sum(f.stat().st_size for f in tools.iterdir())


def prepare(model: Path | None, dest: Path, serve_deps: bool = False, python: str = "3.12") -> int:
    dest.mkdir(parents=True, exist_ok=True)
    total = 0
    if serve_deps:
        packed = write_serve_deps(dest, python)
        print(f"wrote the e2e server's dependencies for Python {python}: {dest / 'wheels'} ({packed / 2**20:.1f} MiB)")
        total += packed
        tools = write_tools(dest)
        print(f"wrote wrk and its LuaJIT: {dest / 'tools'} ({tools / 2**20:.1f} MiB)" if tools else
              "wrk is not installed here: scripts/gpu-serving.sh will need it on the GPU host")
        total += tools
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


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def serve_distributions() -> dict[str, str]:
    """name -> installed version of every distribution the e2e server check needs that the GPU host lacks."""
    probe = ("import importlib, json, sys\n"
             f"for name in {SERVE_IMPORTS!r}:\n    importlib.import_module(name)\n"
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names))))\n")
    root = str(Path(__file__).resolve().parent.parent)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=root, check=True,
                          env={"PYTHONPATH": os.pathsep.join([str(Path(root) / ".pythonpath"), root]), "PATH": ""})
    top_level = json.loads(done.stdout.strip().splitlines()[-1])
    by_module = metadata.packages_distributions()
    host = {_normal(n) for n in ON_THE_HOST} | {_normal(r) for r in _requirements("torch")}
    wanted = {_normal(d) for module in top_level for d in by_module.get(module, [])}
    found: dict[str, str] = {}
    queue = sorted(wanted - host)
    while queue:
        name = queue.pop()
        if name in found or name in host:
            continue
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # an optional requirement this environment does not have: the server runs without it too
        queue.extend(_normal(r) for r in _requirements(name))
    return dict(sorted(found.items()))


def _requirements(name: str) -> list[str]:
    """The names of `name`'s unconditional requirements (no extras, no environment markers)."""
    try:
        declared = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        return []
    return [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in declared if ";" not in r]


def pip_download_command(dists: dict[str, str], wheels: Path, python: str) -> list[str]:
    version = python.replace(".", "")
    platforms = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
    return [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--python-version", python, "--implementation", "cp", "--abi", f"cp{version}", "--abi", "abi3",
            "--abi", "none", *(arg for p in platforms for arg in ("--platform", p)), "--dest", str(wheels),
            *(f"{name}=={ver}" for name, ver in dists.items())]


def write_serve_deps(dest: Path, python: str) -> int:
    """Download the wheels for `python` into dest/wheels; returns their bytes."""
    dists = serve_distributions()
    wheels = dest / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    subprocess.run(pip_download_command(dists, wheels, python), check=True)
    (wheels / "CARRIED.json").write_text(json.dumps({"python": python, "distributions": dists}, indent=2) + "\n")
    return sum(f.stat().st_size for f in wheels.iterdir())


def unpack_wheels(wheels: Path, site: Path) -> Path:
    """Every wheel in `wheels` unpacked into `site` (a wheel is a zip laid out for site-packages)."""
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    return site
