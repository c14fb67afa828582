"""The per-family comparison script runs (tiny models, one round) and reports what
docs/benchmarks/2026-12-01-families-vs-transformers.md quotes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.engine_vs_transformers import compare
from glassbox.service.bench.mix import synthetic_mix
from tests.families import save_family_model


@pytest.mark.parametrize("case", ["distilbert", "xlm-roberta"])
def test_compare_times_glassbox_and_transformers_on_a_family_model(tmp_path: Path, case: str) -> None:
    path = save_family_model(tmp_path / case, case).path
    results = compare(path, synthetic_mix(24), ["sorted:8"], ["glassbox-fp32", "transformers-fp32"], rounds=1,
                      max_length=64)
    summaries = results["sorted:8"]["variants"]
    assert set(summaries) == {"glassbox-fp32", "transformers-fp32"}
    assert all(s["texts"] == 24 and s["throughput_seq_per_s"] > 0 for s in summaries.values())
    # Both ran the same batches, and the same model gives the same predictions.
    assert summaries["glassbox-fp32"]["mean_tokens"] == summaries["transformers-fp32"]["mean_tokens"]
    assert results["sorted:8"]["speed_ratios"]["glassbox-fp32 / transformers-fp32"] > 0


def test_the_script_runs_as_documented(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "families_vs_transformers.py"
    out = subprocess.run([sys.executable, str(script), "--size", "tiny", "--rounds", "1", "--cases", "electra",
                          "--variants", "glassbox-fp32,transformers-fp32", "--json-out", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert "| electra | sorted:32 | glassbox-fp32 |" in out and "glassbox-fp32 / transformers-fp32 speed =" in out
    assert (tmp_path / "r.json").is_file()
