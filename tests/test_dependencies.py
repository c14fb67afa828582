"""What `glassbox serve` and the commands import comes with `pip install glassbox`, not only with the dev extra.

On 2026-12-07 a fresh `make run` (which installs without `[dev]`) died at start with `No module named 'psutil'`:
service/cores.py imported it, and only the dev extra listed it, so every machine that had run `make test` first hid
the gap. Here every third-party module the runtime packages have imported is traced to its distribution, and that
distribution must be one of the project's own dependencies or something they require, in any depth.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

# Imported only when asked for (each with its own guard and message), or by a library that uses it
# when present and does without it (httpx decodes brotli responses when `brotli` is installed).
OPTIONAL = {"ray", "pyspark", "pandas", "pyarrow", "torchao", "brotli"}
RUNTIME = ("glassbox.service.cli", "glassbox.service.server", "glassbox.service.app",
           "glassbox.service.serving.supervisor", "glassbox.service.bulk.command", "glassbox.telemetry.setup",
           "glassbox.telemetry.otlp", "glassbox.chaos.cli", "glassbox.chaos.runner")


def _name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _closure(roots: list[str]) -> set[str]:
    """The distributions `roots` require, recursively, extras asked for included, markers that do not apply skipped."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        requirement = todo.pop()
        name = _name(requirement)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        extras = set(re.findall(r"\[([^\]]*)\]", requirement)[0].split(",")) if "[" in requirement else set()
        for sub in requires:
            marker = sub.split(";", 1)[1] if ";" in sub else ""
            wanted = re.search(r"extra\s*==\s*['\"]([^'\"]+)", marker)
            if wanted and wanted.group(1) not in extras:
                continue
            todo.append(sub.split(";", 1)[0])
    return seen


def imported_by_the_runtime() -> set[str]:
    """Top-level modules in sys.modules after importing RUNTIME, in a fresh interpreter (pytest's own plugins would
    be counted here)."""
    code = (f"import importlib, json, sys; [importlib.import_module(m) for m in {RUNTIME!r}]; "
            "print(json.dumps(sorted({n.split('.', 1)[0] for n in sys.modules})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return set(json.loads(done.stdout))


def test_every_module_the_runtime_imports_is_a_declared_dependency() -> None:
    declared = _closure(_project_dependencies())
    by_module = metadata.packages_distributions()
    missing = {}
    for module in sorted(imported_by_the_runtime()):
        if module in OPTIONAL or module in sys.stdlib_module_names or module.startswith("_"):
            continue
        if module in ("glassbox", "tests", "benchmarks"):
            continue
        distributions = {d.lower().replace("_", "-") for d in by_module.get(module, [])}
        if distributions and not distributions & declared:
            missing[module] = sorted(distributions)
    assert not missing, f"imported by the runtime but not in [project] dependencies: {missing}"


def _project_dependencies() -> list[str]:
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"])
