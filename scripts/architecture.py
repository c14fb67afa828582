"""The map of docs/architecture.md, drawn from the code: which part of glassbox imports which.

    .venv/bin/python scripts/architecture.py            # the Mermaid diagram, to paste into docs/architecture.md
    .venv/bin/python scripts/architecture.py --check    # exit 1 when docs/architecture.md holds a different one

A part is a subpackage (`service.engines`), a top-level module of `service` (`service.app`), or a whole package
for `telemetry` and `chaos`, each drawn as one box and named without the `glassbox.` every module's name starts with. An
arrow A --> B means some module of A imports some module of B at its top level; imports inside functions, and the CLI's
imports by module name, are drawn dotted: they run only on that path. Read from the source with `ast`, nothing imported.
`tests/scripts/test_architecture.py` runs `--check`, so the picture in the doc is the code's.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("service", "telemetry", "chaos")  # folders at the top of the tree, installed as glassbox.<folder>
NAMESPACE = "glassbox"
DOC = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- architecture:begin -->", "<!-- architecture:end -->"
# service's small leaf modules, drawn as one box: everything may import them and they import nothing of the project.
LEAVES = {"service.types", "service.errors", "service.observer", "service.settings", "service.devices",
          "service.buckets", "service.lifecycle"}
# service.serving drawn as the two layouts, peers, and what both use: each layout's own modules in one box.
LAYOUTS = {"one_process": "serving: one process",
           **dict.fromkeys(("supervisor", "engine_process", "worker_process", "remote", "roster", "orphans"),
                           "serving: workers")}
SHARED = "serving: common"


def part_of(module: str) -> str:
    """The box a module (`glassbox.service.engines.base`) is drawn in (`service.engines`)."""
    top = module.removeprefix(f"{NAMESPACE}.").split(".")
    if top[0] in ("telemetry", "chaos"):
        return top[0]
    name = ".".join(top[:2])
    if name == "service.serving":
        return LAYOUTS.get(top[2], SHARED) if len(top) > 2 else SHARED
    return "service leaves" if name in LEAVES else name


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([NAMESPACE, *parts])


def imports_of(path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(modules imported at the top level, modules imported inside functions or by name) of this project's packages.
    A string that is exactly a module's name counts as a lazy import: the CLI imports its commands that way (a package
    of the namespace's top, as in `-m glassbox.service`, starts a process and does not count)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    eager: set[str] = set()
    lazy = {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in known and node.value.count(".") >= 2}
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                continue  # imports for annotations only never run
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                names = [base, *(f"{base}.{alias.name}" for alias in child.names)]
            for name in names:
                if name.split(".")[:1] == [NAMESPACE] and name.split(".")[1:2] and name.split(".")[1] in PACKAGES:
                    (lazy if inner else eager).add(name)
            visit(child, inner)

    visit(tree, False)
    return eager, lazy


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def edges() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(eager, lazy-only) part -> part edges."""
    known = {module_name(path) for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    eager: set[tuple[str, str]] = set()
    lazy: set[tuple[str, str]] = set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = part_of(module_name(path))
            top, inner = imports_of(path, known)
            for found, bucket in ((top, eager), (inner, lazy)):
                for name in found:
                    # `from glassbox.service.wire import frames` names a module or a symbol
                    while name and name not in known:
                        name = name.rpartition(".")[0]
                    if name and part_of(name) != source:
                        bucket.add((source, part_of(name)))
    return eager, lazy - eager


def node_id(part: str) -> str:
    return part.replace(".", "_").replace(" ", "_").replace(":", "")


def mermaid() -> str:
    eager, lazy = edges()
    parts = sorted({p for edge in eager | lazy for p in edge})
    lines = ["```mermaid", "flowchart LR"]
    lines += [f'    {node_id(part)}["{part}"]' for part in parts]
    lines += [f"    {node_id(a)} --> {node_id(b)}" for a, b in sorted(eager)]
    lines += [f"    {node_id(a)} -.-> {node_id(b)}" for a, b in sorted(lazy)]
    lines.append("```")
    return "\n".join(lines)


def in_doc() -> str:
    text = DOC.read_text()
    return text[text.index(BEGIN) + len(BEGIN): text.index(END)].strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with docs/architecture.md instead of printing")
    args = parser.parse_args()
    drawn = mermaid()
    if not args.check:
        print(drawn)
        return 0
    if in_doc() != drawn:
        print("docs/architecture.md's diagram is not the code's: run scripts/architecture.py and paste its output "
              f"between {BEGIN} and {END}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
