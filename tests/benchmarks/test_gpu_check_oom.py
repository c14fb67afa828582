"""The OOM part of the GPU check, rehearsed on the CPU with the simulated GPU: every step runs, the verdict is
computed from what happened (and fails when the fallback did not happen), and gpu_check --oom wires it in.
Nothing here says anything about a real GPU."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from benchmarks import gpu_check
from benchmarks.gpu_check_measure import random_batch
from benchmarks.gpu_check_oom import RUNS, oom_check, oom_phases
from benchmarks.gpu_check_oom_rigs import rehearsal_rig
from glassbox.service.settings import Settings


def test_the_rehearsal_passes_every_step() -> None:
    result = oom_check(rehearsal=True)
    assert (result["status"], result["mode"], result["pass"]) == ("ran", "cpu-rehearsal", True)
    oom = result["oom"]
    assert all(oom["checks"].values()), oom["checks"]
    assert [e["reason"] for e in oom["events"]] == ["oom", "probe_failed", "recovered"]
    assert [e["device"] for e in oom["events"]] == ["cpu", "cpu", "sim-gpu"]
    assert oom["first_error"].startswith("OutOfMemoryError: CUDA out of memory (simulated)")
    latency = oom["latency"]
    assert latency["before"]["devices"] == {"sim-gpu": RUNS["before"]}
    assert latency["during"]["devices"] == {"cpu": RUNS["during"]}
    assert latency["after"]["devices"] == {"sim-gpu": RUNS["after"]}
    for name in ("before", "during", "after"):
        assert 0 < latency[name]["p50_ms"] <= latency[name]["p99_ms"]
    assert (oom["ooms_caught"], oom["probes"]) == (2, 2)  # the first batch, then the probe under filled memory
    pressure = result["pressure"]
    assert pressure["pass"] and pressure["events"] == ["memory_pressure", "recovered"]
    assert pressure["ratio_when_filled"] == 0.99


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the rehearsal itself does: tiny batches on shared cores
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_the_verdict_fails_when_filling_memory_causes_no_oom() -> None:
    rig = rehearsal_rig(random_batch([8] * 4, 2000, np.random.default_rng(0)))

    def fill_nothing() -> dict[str, int]:
        return {}

    rig.fill = fill_nothing
    result = oom_phases(rig, Settings(fallback_cooldown_s=1.0, fallback_cooldown_max_s=8.0))
    assert result["pass"] is False
    assert not result["checks"]["oom_caught"] and not result["checks"]["during_on_cpu_no_failure"]
    assert result["checks"]["before_on_primary"]  # the rest still reports what did hold


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_cuda_the_real_check_is_skipped_and_does_not_pass() -> None:
    assert oom_check() == {"status": "skipped", "pass": False, "reason": "no CUDA device"}


def test_gpu_check_oom_flag_runs_it_and_keeps_it_in_the_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_models(args: Any) -> list[dict[str, Any]]:
        return []  # only the OOM part is under test here; test_gpu_check.py covers the rest

    monkeypatch.setattr(gpu_check, "model_specs", no_models)
    out = tmp_path / "gpu-check.json"
    code = gpu_check.main(["--cpu-rehearsal", "--oom", "--skip-pytest", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "oom PASS [cpu-rehearsal]" in printed and "during: p50" in printed
    data = json.loads(out.read_text())
    assert data["oom"]["pass"] is True and data["pass"] is True


def test_a_script_error_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(batch: Any) -> Any:
        raise RuntimeError("the rig could not be built")

    monkeypatch.setattr("benchmarks.gpu_check_oom.rehearsal_rig", broken)
    threads = torch.get_num_threads()
    result = oom_check(rehearsal=True)
    assert (result["status"], result["pass"]) == ("error", False)
    assert result["reason"] == "RuntimeError: the rig could not be built"
    assert "the rig could not be built" in result["traceback"]
    assert torch.get_num_threads() == threads  # restored on the way out
