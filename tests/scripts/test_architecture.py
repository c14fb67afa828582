"""docs/architecture.md's diagram is the code's: scripts/architecture.py draws it from the imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import architecture  # noqa: E402  (scripts/ is not a package)


def test_the_doc_holds_the_diagram_the_code_draws() -> None:
    done = subprocess.run([sys.executable, "scripts/architecture.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_diagram_shows_the_rules_it_is_read_for() -> None:
    eager, lazy = architecture.edges()
    # telemetry and chaos are reached only lazily, and only from the composition roots (the server's, and the
    # classify command's, which reports through the server's telemetry)
    into_plugins = {(a, b) for a, b in eager | lazy if b in ("telemetry", "chaos")}
    assert into_plugins and not {edge for edge in into_plugins if edge in eager}
    assert {a for a, _ in into_plugins} <= {"service.app", "service.cli", "serving: common", "serving: workers",
                                            "service.bulk"}
    # the leaves import nothing of the project
    assert not {edge for edge in eager | lazy if edge[0] == "service leaves"}
    # the CLI reaches its commands by name only
    assert ("service.cli", "service.server") in lazy


def test_the_two_layouts_are_peers_with_no_circle() -> None:
    eager, lazy = architecture.edges()
    edges = eager | lazy
    layouts = {"serving: one process", "serving: workers"}
    # `glassbox serve` starts either; neither imports the other, nor the command that starts them
    assert {("service.server", layout) for layout in layouts} <= lazy
    assert not {(a, b) for a, b in edges if a in layouts and (b in layouts or b == "service.server")}
    # no circle through the command, the layouts or what they share (the app included)
    parts = {"service.server", "service.app", "serving: common", *layouts}
    reach = {part: {b for a, b in edges if a == part} for part in parts}
    for _ in parts:  # transitive closure over the whole diagram
        reach = {part: found | {c for b in found for a, c in edges if a == b} for part, found in reach.items()}
    assert not [part for part in parts if part in reach[part]]


def test_relative_and_lazy_imports_are_read(tmp_path: Path) -> None:
    module = ROOT / "service" / "serving" / "one_process.py"
    top, inner = architecture.imports_of(module, {"glassbox.service.app", "glassbox.service.serving.http_server"})
    assert "glassbox.service.serving.http_server" in top
    assert "glassbox.service.app" in inner
