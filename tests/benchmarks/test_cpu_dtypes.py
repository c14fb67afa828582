"""benchmarks/cpu_dtypes.py runs end to end on a tiny model (one short round of each part) and reports what
docs/benchmarks/2026-12-07-bf16.md quotes."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.cpu_dtypes import bert_base, builtin, served
from tests.helpers import with_heldout_file


@pytest.fixture
def with_heldout(tiny_model_dir: Path, tmp_path: Path) -> Path:
    return with_heldout_file(tiny_model_dir, tmp_path / "model", 24)


def test_bert_base_compares_the_three_formats() -> None:
    result = bert_base(rounds=1, batch=2, length=8, batches=1)
    assert set(result["seq_per_s"]) == {"fp32", "bf16", "int8"} and all(v > 0 for v in result["seq_per_s"].values())
    assert set(result["speedup_vs_fp32"]) == {"bf16", "int8"} and all(v > 0 for v in result["speedup_vs_fp32"].values())
    # random BERT-base weights: bf16 stays close to fp32 (docs/models.md states the tolerance of the parity tests)
    assert result["max_logit_difference_vs_fp32"]["bf16"] < 0.05


def test_builtin_and_served_on_a_model_with_held_out_texts(with_heldout: Path) -> None:
    report = builtin(1, with_heldout)
    assert list(report["variants"]) == ["eager-fp32", "eager-bf16", "eager-int8"] and report["texts"] == 24
    result = served(rounds=1, duration_s=1, connections=2, model_dir=with_heldout)
    assert result["chosen"]["fp32"] == "CPU number format fp32: --cpu-dtype fp32 was asked for"
    # the default chose for itself and said why (bf16 or fp32 depends on this CPU and on the tiny model's gate)
    assert result["chosen"]["default"].startswith("CPU number format ") and "auto: " in result["chosen"]["default"]
    assert all(len(r) == 1 and r[0] > 0 for r in result["requests_per_s"].values())
    assert result["ratio_default_vs_fp32"] > 0
