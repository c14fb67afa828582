"""scripts/gpu-serving.sh, the serving measures for a GPU host, runs every step in its CPU rehearsal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
