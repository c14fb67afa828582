"""Draw docs/performance.md's plots from docs/performance/figures.json (the series, each copied from the dated
benchmark record it names).

    python scripts/performance_plots.py [--out DIR]   # default: docs/performance
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "docs" / "performance" / "figures.json"
PLOTS = ("served-offline.png", "gpu-workers.png", "cpu-speedups.png")


def _finish(figure: Any, axes: Any, data: dict[str, Any], path: Path) -> None:
    """Title, grid, legend, and the machines measured (CPU flags, GPU) along the bottom: the hosts change."""
    axes.set_title(data["title"], fontsize=10)
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    figure.text(0.01, 0.01, textwrap.fill(data["machines"], 150), fontsize=6, va="bottom")
    figure.savefig(path, dpi=110)
    plt.close(figure)


def served_offline(data: dict[str, Any], path: Path) -> None:
    figure, axes = plt.subplots(figsize=(7, 3.9))
    connections = data["connections"]
    width = 0.8 / len(data["series"])
    for i, series in enumerate(data["series"]):
        xs = [c + (i - (len(data["series"]) - 1) / 2) * width for c in range(len(connections))]
        shown = [(x, r) for x, r in zip(xs, series["ratios"], strict=True) if r is not None]
        axes.bar([x for x, _ in shown], [r for _, r in shown], width, label=series["label"])
    axes.axhline(0.85, color="black", linestyle="--", linewidth=0.8, label="target at 8 connections (0.85)")
    axes.set_xticks(range(len(connections)), [f"{c} connection{'s' if c > 1 else ''}" for c in connections])
    axes.set_ylabel("served / offline")
    axes.set_ylim(0, 1)
    _finish(figure, axes, data, path)


def gpu_workers(data: dict[str, Any], path: Path) -> None:
    figure, axes = plt.subplots(figsize=(7, 3.9))
    for series in data["series"]:
        axes.plot(data["workers"], series["rps"], marker="o", label=series["label"])
    axes.set_xticks(data["workers"])
    axes.set_xlabel("HTTP worker processes (--workers)")
    axes.set_ylabel("requests / s")
    axes.text(0.02, 0.92, f"{data['reference']['label']} (off the chart)", transform=axes.transAxes, fontsize=8)
    _finish(figure, axes, data, path)


def cpu_speedups(data: dict[str, Any], path: Path) -> None:
    figure, axes = plt.subplots(figsize=(7, 3.9))
    width = 0.8 / len(data["series"])
    for i, series in enumerate(data["series"]):
        xs = [c + (i - (len(data["series"]) - 1) / 2) * width for c in range(len(data["cases"]))]
        axes.bar(xs, series["speedups"], width, label=series["label"])
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(len(data["cases"])), data["cases"], fontsize=8)
    axes.set_ylabel("x fp32")
    _finish(figure, axes, data, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIGURES.parent)
    args = parser.parse_args(argv)
    figures = json.loads(FIGURES.read_text(encoding="utf-8"))
    args.out.mkdir(parents=True, exist_ok=True)
    served_offline(figures["served_offline"], args.out / PLOTS[0])
    gpu_workers(figures["gpu_workers"], args.out / PLOTS[1])
    cpu_speedups(figures["cpu_speedups"], args.out / PLOTS[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
