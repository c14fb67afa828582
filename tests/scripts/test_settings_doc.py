"""docs/settings.md is what service/settings.py says (scripts/settings_doc.py writes it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_settings_page_is_the_settings() -> None:
    done = subprocess.run([sys.executable, "scripts/settings_doc.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
