"""docs/performance.md's plots are drawn by scripts/performance_plots.py from docs/performance/figures.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_plots_are_drawn_from_the_figures_and_the_page_shows_them(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "scripts/performance_plots.py", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    drawn = sorted(p.name for p in tmp_path.iterdir())
    assert drawn == ["cpu-speedups.png", "gpu-workers.png", "served-offline.png"]
    assert all((tmp_path / name).read_bytes().startswith(b"\x89PNG") for name in drawn)
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert len(page.splitlines()) < 200
    for name in drawn:
        assert f"(performance/{name})" in page and (ROOT / "docs" / "performance" / name).is_file()
    figures = json.loads((ROOT / "docs" / "performance" / "figures.json").read_text(encoding="utf-8"))
    assert all(figures[key]["source"] and figures[key]["machines"] for key in ("served_offline", "gpu_workers",
                                                                         "cpu_speedups"))
