"""scripts/gpu-serving.sh, the serving measures for a GPU host, runs every step in its CPU rehearsal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gpu_serving_summary import TARGETS, summary

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk (apt-get install wrk)")
def test_the_cpu_rehearsal_runs_every_step_and_writes_its_json(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "heldout.jsonl").write_text("a fine film\nnot much of a film, really\n" * 20)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "MODEL": str(model), "PYTHON": sys.executable}
    done = subprocess.run([str(ROOT / "scripts" / "gpu-serving.sh"), "--cpu-rehearsal"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for engine in ("null", "model"):
        front = json.loads((out / f"frontend-{engine}.json").read_text())
        assert front["engine"] == engine and set(front["median"]) == {"0", "1"}
        assert all(m["requests_per_s"] > 0 and m["mean_batch"] >= 1 for m in front["median"].values())
    serving = json.loads((out / "serving.json").read_text())
    assert serving["device"] == "cpu" and set(serving["median"]["levels"]) == {"1", "8"}
    assert all(level["ratio"] > 0 for level in serving["median"]["levels"].values())
    share = json.loads((out / "cpu-share.json").read_text())
    assert share["device"] == "cpu" and share["serve_args"] == ["--workers=1"]
    # One HTTP worker and the engine process under the supervisor: each one's event loop did work.
    assert {"engine/main", "worker/main"} <= set(share["by_kind"])
    assert all(share["by_kind"][key]["cpu_ms_per_request"] > 0 for key in ("engine/main", "worker/main"))
    multi = json.loads((out / "serving-multi.json").read_text())
    assert multi["texts_per_request"] == 32 and set(multi["median"]["levels"]) == {"2"}
    assert multi["median"]["levels"]["2"]["texts_per_s"] == pytest.approx(
        32 * multi["median"]["levels"]["2"]["requests_per_s"], rel=1e-3)
    summary = json.loads((out / "summary.json").read_text())
    figures = summary["figures"]
    assert summary["device"] == "cpu" and set(figures) == set(TARGETS)
    # A rehearsal measures every figure but BERT-base's, and judges only the CPU host's.
    assert [name for name, row in figures.items() if row["value"] is None] == ["bert_base_rps_p99_10ms"]
    assert [name for name, row in figures.items() if row["met"] is not None] == ["cpu_host_ratio"]


def write(folder: Path, name: str, data: dict[str, Any]) -> None:
    (folder / f"{name}.json").write_text(json.dumps(data))


def test_the_summary_computes_each_figure_from_the_steps_and_judges_it_against_its_target(tmp_path: Path) -> None:
    write(tmp_path, "serving", {"device": "cuda", "median": {"levels": {
        "1": {"requests_per_s": 900.0, "p99_ms": 2.0},
        "256": {"requests_per_s": 26000.0, "p99_ms": 30.0, "infer_mean_ms": 1.2, "mean_batch": 32.0,
                "offline_seq_per_s": 64000.0}}}})
    write(tmp_path, "frontend-null", {"median": {"1": {"requests_per_s": 3100.0}, "8": {"requests_per_s": 20000.0},
                                                 "8@baseline": {"requests_per_s": 1.0}}})
    write(tmp_path, "frontend-model", {"median": {"1": {"requests_per_s": 3000.0}, "8": {"requests_per_s": 18000.0}}})
    write(tmp_path, "serving-multi", {"texts_per_request": 32, "median": {"levels": {
        "8": {"ratio": 0.5, "texts_per_s": 1.0, "offline_seq_per_s": 2.0},
        "32": {"ratio": 0.75, "texts_per_s": 48000.0, "offline_seq_per_s": 64000.0}}}})
    figures = summary(tmp_path)["figures"]
    value = {name: row["value"] for name, row in figures.items()}
    met = {name: row["met"] for name, row in figures.items()}
    assert value["run_inflation"] == pytest.approx(1.2 / 0.5)  # 32 rows at 64 000/s offline: 0.5 ms
    assert value["model_vs_null"] == pytest.approx(0.9)  # the worse of 3000/3100 and 18000/20000
    assert value["per_worker_null_rps"] == 3100.0 and value["host_rps"] == 26000.0 and value["host_p99_ms"] == 30.0
    assert value["multi_text_ratio"] == 0.75 and value["cpu_host_ratio"] is None
    assert met == {"run_inflation": False, "model_vs_null": False, "per_worker_null_rps": True, "host_rps": True,
                   "host_p99_ms": False, "multi_text_ratio": True, "bert_base_rps_p99_10ms": None,
                   "cpu_host_ratio": None}


def test_a_run_that_wrote_nothing_has_every_figure_unmeasured(tmp_path: Path) -> None:
    result = summary(tmp_path)
    assert all(row["value"] is None and row["met"] is None for row in result["figures"].values())
