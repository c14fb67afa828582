"""Running glassbox from a given checkout: the tree under test, or a baseline one for a side-by-side run.

The folders service/, telemetry/ and chaos/ are imported as glassbox.service, glassbox.telemetry and glassbox.chaos;
in a checkout, .pythonpath/glassbox/ links them under that name, so a checkout's code runs uninstalled with its
.pythonpath first on PYTHONPATH (ahead of whatever the venv installed). A checkout from before the namespace
(2026-12-07) has no .pythonpath and is run as it was then: `python -m service` from its root.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path


def glassbox_command(tree: Path) -> list[str]:
    """`python -m <glassbox's main module>` as the checkout in `tree` names it; run it with cwd=tree."""
    module = "glassbox.service" if (tree / ".pythonpath" / "glassbox").is_dir() else "service"
    return [sys.executable, "-m", module]


def environment(tree: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (os.environ by default) with the checkout's code first on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    ahead = [str(tree / ".pythonpath"), str(tree)]
    env["PYTHONPATH"] = os.pathsep.join([*ahead, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    return env
