"""The figures of "Feed the GPU" (issue 44) from one run of scripts/gpu-serving.sh, each beside its target.

    .venv/bin/python -m benchmarks.gpu_serving_summary OUT_DIR [--json OUT]

Reads the steps' JSON files in OUT_DIR (frontend-null, frontend-model, serving, serving-multi) and prints one JSON
object: for each figure under a stable name its value, the target, whether it was met (null where the run did not
measure it, or where the figure is a GPU host's and the run was the CPU rehearsal), and how it was obtained.

- `run_inflation`: the infer stage inside the server (glassbox_stage_duration_seconds{stage="infer"}, mean over the
  requests of the run at the most connections) over the time the offline engine takes for a batch of the server's
  mean batch size at its rate at that load (`benchmarks.serving`). Above 1 the server's runs take longer than the
  same engine's alone.
- `model_vs_null`: served with the model over served with the null engine, at the same worker count; the lowest
  over the counts measured (`benchmarks.frontend`).
- `per_worker_null_rps`: one HTTP worker process on the null engine.
- `host_rps`, `host_p99_ms`: the server with its defaults at the most connections, one text per request.
- `multi_text_ratio`: texts per second served with many texts per request over the offline engine with as many
  texts in flight (`benchmarks.serving --texts-per-request`).
- `bert_base_rps_p99_10ms`: from scripts/gpu-check.sh (e2e_server on BERT-base), not this script: always null here.
- `cpu_host_ratio`: served over offline at 8 connections on a CPU host (the CPU rehearsal measures it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from glassbox.service.bench.measure import emit

# name: (target, "max" when the figure must stay at or under it, else "min"; which host it is a figure of)
TARGETS: dict[str, tuple[float, str, str]] = {
    "run_inflation": (1.5, "max", "gpu"),
    "model_vs_null": (0.95, "min", "gpu"),
    "per_worker_null_rps": (3000.0, "min", "gpu"),
    "host_rps": (25000.0, "min", "gpu"),
    "host_p99_ms": (25.0, "max", "gpu"),
    "multi_text_ratio": (0.7, "min", "gpu"),
    "bert_base_rps_p99_10ms": (10000.0, "min", "gpu"),
    "cpu_host_ratio": (0.85, "min", "cpu"),
}


def _read(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / f"{name}.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _top_level(serving: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    levels = serving.get("median", {}).get("levels", {})
    if not levels:
        return None
    top = max(levels, key=int)
    return top, levels[top]


def figures(folder: Path) -> dict[str, tuple[float | None, str]]:
    """Each figure's value (None where not measured) and how it was obtained."""
    out: dict[str, tuple[float | None, str]] = {name: (None, "not measured in this run") for name in TARGETS}
    serving = _read(folder, "serving")
    device = serving.get("device", "") if serving else ""
    if serving and (top := _top_level(serving)) is not None:
        level, row = top
        if row.get("infer_mean_ms") and row.get("mean_batch") and row.get("offline_seq_per_s"):
            offline_ms = 1000.0 * row["mean_batch"] / row["offline_seq_per_s"]
            out["run_inflation"] = (row["infer_mean_ms"] / offline_ms,
                                    f"serving at {level} connections: infer {row['infer_mean_ms']:.3f} ms a request "
                                    f"against {offline_ms:.3f} ms offline for a batch of {row['mean_batch']:.1f}")
        out["host_rps"] = (row.get("requests_per_s"), f"serving at {level} connections, defaults")
        out["host_p99_ms"] = (row.get("p99_ms"), f"serving at {level} connections, defaults")
        levels = serving["median"]["levels"]
        if device == "cpu" and "8" in levels:
            out["cpu_host_ratio"] = (levels["8"].get("ratio"), "serving at 8 connections, served/offline")
    null, model = _read(folder, "frontend-null"), _read(folder, "frontend-model")
    if null and model:
        pairs = {w: (model["median"][w]["requests_per_s"], null["median"][w]["requests_per_s"])
                 for w in null.get("median", {}) if w in model.get("median", {}) and "@" not in w}
        ratios = {w: m / n for w, (m, n) in pairs.items() if n}
        if ratios:
            worst = min(ratios, key=lambda w: ratios[w])
            by_workers = sorted(ratios.items(), key=lambda item: int(item[0]))
            out["model_vs_null"] = (ratios[worst], "frontend model/null by workers: " +
                                    ", ".join(f"{w}: {r:.3f}" for w, r in by_workers))
    if null and "1" in null.get("median", {}):
        out["per_worker_null_rps"] = (null["median"]["1"]["requests_per_s"], "frontend null engine, 1 worker")
    multi = _read(folder, "serving-multi")
    if multi and (top := _top_level(multi)) is not None:
        level, row = top
        out["multi_text_ratio"] = (row.get("ratio"), f"serving, {multi.get('texts_per_request')} texts a request, "
                                   f"{level} connections: {row.get('texts_per_s', 0):.0f} texts/s served against "
                                   f"{row.get('offline_seq_per_s', 0):.0f} offline")
    out["bert_base_rps_p99_10ms"] = (None, "measured by scripts/gpu-check.sh (e2e_server), not this script")
    return out


def summary(folder: Path) -> dict[str, Any]:
    serving = _read(folder, "serving") or {}
    device = serving.get("device", "unknown")
    rows: dict[str, Any] = {}
    for name, (value, how) in figures(folder).items():
        target, direction, host = TARGETS[name]
        met: bool | None = None
        if value is not None and (host == "cpu") == (device == "cpu"):
            met = value <= target if direction == "max" else value >= target
        rows[name] = {"value": None if value is None else round(float(value), 4), "target": target,
                      "direction": "at most" if direction == "max" else "at least", "host": host, "met": met,
                      "how": how}
    return {"device": device, "machine": serving.get("machine"), "date": serving.get("date"),
            "note": "a CPU rehearsal: the GPU figures show that the steps run, never whether a target is met"
            if device == "cpu" else "", "figures": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    emit(summary(args.folder), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
