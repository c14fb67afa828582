"""Shared by the deploy tests: the repository's paths, YAML loading, and finding the external tools they run.

An external tool (promtool, docker-compose, kubernetes-validate) or optional package that is missing makes its
tests fail under `make test`, which sets GLASSBOX_REQUIRE_TOOLS=1, and skip with the reason everywhere else.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS_DIR = DEPLOY / "prometheus"
OTEL_DIR = DEPLOY / "otel"
K8S_DIR = DEPLOY / "k8s"
COMPOSE_FILE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
TOOL_TIMEOUT_S = 60


def _missing(message: str) -> NoReturn:
    if os.environ.get("GLASSBOX_REQUIRE_TOOLS") == "1":
        pytest.fail(message + " (GLASSBOX_REQUIRE_TOOLS=1)")
    pytest.skip(message)


def require_tool(name: str, hint: str) -> str:
    """The executable's path: on PATH, or next to this interpreter (console scripts of the venv)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        _missing(f"`{name}` is not installed; {hint}")
    return found


def require_module(name: str, hint: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError:
        _missing(f"Python module `{name}` is not installed; {hint}")


def run_tool(args: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_yaml_all(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def host_port(address: str, default_port: int | None = None) -> tuple[str, int]:
    """`http://tempo:3200`, `tempo:4317` or `0.0.0.0:4318` -> (host, port)."""
    parts = urlsplit(address if "://" in address else f"//{address}")
    port = parts.port or default_port
    assert parts.hostname and port, f"no host and port in {address!r}"
    return parts.hostname, port
