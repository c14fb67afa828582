"""One import namespace: the folders service/, telemetry/ and chaos/ install as glassbox.service, glassbox.telemetry and
glassbox.chaos, never as top-level packages that PyPI's `service` or `telemetry` would overwrite (or be overwritten
by).

The wheel is built from the tree as the Dockerfile builds it, installed into a venv of its own beside those two PyPI
distributions, and served from there: `--workers 1`, so the supervisor, the engine process and an HTTP worker all
import from the installed wheel. The venv takes its third-party dependencies (torch and the rest) from the test's
own venv through a path entry: installing torch again would take minutes and prove nothing about the namespace.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import shutil
import site
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import httpx
import pytest

from glassbox.chaos.local import free_port
from tests.helpers import make_tiny_model_dir
from tests.service.apptools import wait_until

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("service", "telemetry", "chaos")
# PyPI distributions whose import packages carry the folders' names (checked in the package list: `service` 0.6.0,
# "Easy Implementation of Background Services"; `telemetry` 2.0.8, "Remote measurements for your app").
NAMESAKES = ("service==0.6.0", "telemetry==2.0.8")
SOURCE_DIRS = ("service", "telemetry", "chaos", "tests", "benchmarks", "scripts", "examples", "docs")
# Strings that look like a folder's module and are not one: OpenTelemetry's resource attributes, and the diagram's box
# names (scripts/architecture.py draws `service.app` without the prefix).
NOT_MODULES = {"service.version", "service.name"}
BOX_NAMES = {"scripts/architecture.py", "tests/scripts/test_architecture.py"}


def _pyproject() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_folder_with_python_files_is_a_listed_package() -> None:
    found = {"glassbox." + ".".join(path.parent.relative_to(ROOT).parts)
             for folder in FOLDERS for path in (ROOT / folder).rglob("*.py") if "__pycache__" not in path.parts}
    setuptools = _pyproject()["tool"]["setuptools"]
    assert set(setuptools["packages"]) == found, "pyproject.toml's [tool.setuptools] packages must list every folder"
    assert setuptools["package-dir"] == {f"glassbox.{folder}": folder for folder in FOLDERS}
    for folder in found:  # a folder without __init__.py would install, but nothing would say it is a package
        assert (ROOT / Path(*folder.split(".")[1:]) / "__init__.py").is_file(), folder


def test_the_checkout_links_the_folders_under_the_namespace() -> None:
    for folder in FOLDERS:
        link = ROOT / ".pythonpath" / "glassbox" / folder
        assert link.is_symlink() and link.resolve() == (ROOT / folder).resolve(), link
    assert not (ROOT / ".pythonpath" / "glassbox" / "__init__.py").exists()  # a namespace, as installed


def test_no_code_imports_a_folder_by_its_bare_name() -> None:
    bare = []
    for base in SOURCE_DIRS:
        for path in (ROOT / base).rglob("*.py"):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                bare += [f"{path.relative_to(ROOT)}:{node.lineno} {name}" for name in names
                         if name.split(".")[0] in FOLDERS]
                if (isinstance(node, ast.Constant) and _names_a_module_barely(node.value)  # monkeypatch targets
                        and str(path.relative_to(ROOT)) not in BOX_NAMES):
                    bare.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
                if isinstance(node, ast.List | ast.Tuple):  # [sys.executable, "-m", "service", ...]
                    values = [item.value if isinstance(item, ast.Constant) else None for item in node.elts]
                    bare += [f"{path.relative_to(ROOT)}:{node.lineno} -m {module}" for flag, module in
                             itertools.pairwise(values)
                             if flag == "-m" and isinstance(module, str) and module.split(".")[0] in FOLDERS]
    assert not bare, "import glassbox.<folder>..., not the folder's bare name:\n" + "\n".join(bare)


def _names_a_module_barely(value: object) -> bool:
    """'service.app' or 'chaos.loadgen.slice.platform' (a module of a folder, maybe with attributes after it)."""
    if not isinstance(value, str) or value in NOT_MODULES or "." not in value or value.split(".")[0] not in FOLDERS:
        return False
    parts = value.split(".")
    return any((ROOT / Path(*parts[:k])).with_suffix(".py").is_file() or (ROOT / Path(*parts[:k])).is_dir()
               for k in range(2, len(parts) + 1))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of what the Dockerfile copies (the checkout itself stays untouched)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(source)], check=True, capture_output=True, timeout=300)
    (built,) = out.glob("glassbox_serve-*.whl")
    return built


def test_the_wheel_holds_one_top_level_import_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"glassbox"}
    assert not any(name == "glassbox/__init__.py" for name in names)
    assert "glassbox/service/ipc/link.py" in names and "glassbox/chaos/experiments/oom-fallback.yaml" in names
    assert "glassbox/service/http/docs_page/docs.js" in names
    (top_level,) = [name for name in names if name.endswith(".dist-info/top_level.txt")]
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(top_level).decode().split() == ["glassbox"]


@pytest.fixture(scope="module")
def clean_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with the wheel and PyPI's `service` and `telemetry` installed (those two built from their sdists on
    the package index), and this venv's site-packages as a plain path entry for the third-party dependencies."""
    wheels = tmp_path_factory.mktemp("namesakes")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                            str(wheels), *NAMESAKES], capture_output=True, text=True, timeout=300)
    if built.returncode != 0:
        if os.environ.get("GLASSBOX_REQUIRE_TOOLS") == "1":
            pytest.fail(f"could not fetch {NAMESAKES} from the package index: {built.stderr[-2000:]}")
        pytest.skip(f"the package index is out of reach: {built.stderr[-300:]}")
    home = tmp_path_factory.mktemp("clean-venv")
    venv.EnvBuilder(with_pip=True).create(home)
    python = home / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", *map(str, sorted(wheels.glob("*.whl"))),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    # After the venv's own site-packages: a plain entry, so the test venv's own .pth files (its editable glassbox
    # among them) are not run.
    (Path(purelib) / "zz_test_venv_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return home


def test_the_installed_wheel_imports_beside_its_namesakes(clean_venv: Path, tmp_path: Path) -> None:
    # The namesakes are found, not imported: PyPI's `service` needs python-daemon to import, which is beside the point.
    code = ("import importlib.util, json, glassbox.service.cli, glassbox.telemetry.setup, glassbox.chaos.runner\n"
            "files = {name: importlib.util.find_spec(name).origin for name in ('service', 'telemetry')}\n"
            "print(json.dumps({**files, 'glassbox': glassbox.service.cli.__file__}))")
    done = subprocess.run([str(clean_venv / "bin" / "python"), "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=_clean_env())
    assert done.returncode == 0, done.stderr
    files = json.loads(done.stdout)
    assert all(str(clean_venv) in path for path in files.values()), files  # none from the checkout
    assert "/glassbox/service/cli.py" in files["glassbox"]
    assert "/service/__init__.py" in files["service"] and "/telemetry/__init__.py" in files["telemetry"]


def test_the_installed_wheel_serves_beside_its_namesakes(clean_venv: Path, tmp_path: Path) -> None:
    model = make_tiny_model_dir(tmp_path / "model")
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    server = subprocess.Popen([str(clean_venv / "bin" / "glassbox"), "serve", "--model", str(model), "--device", "cpu",
                               "--port", str(port), "--workers", "1", "--log-format", "text"],
                              cwd=tmp_path, env=_clean_env(), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url) or server.poll() is not None, "the installed server is ready", bound_s=120)
        assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        answer = httpx.post(f"{url}/v1/classify", json={"text": "a fine film"}, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["results"][0]["label"] in {"negative", "neutral", "positive"}
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _clean_env() -> dict[str, str]:
    """No PYTHONPATH (the checkout must not leak in) and no GLASSBOX_* settings from the test run's environment."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("GLASSBOX_")}
