"""The GPU check script, rehearsed on the CPU: it must work before anyone spends GPU minutes on it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from benchmarks import gpu_check, gpu_check_serve
from benchmarks.gpu_check_book import CATALOGUE, REQUIRED, CheckBook
from benchmarks.gpu_check_carry import (
    pip_download_command,
    serve_distributions,
    unpack_wheels,
    write_fp16_model,
    write_pydeps,
    write_tools,
)
from benchmarks.gpu_check_serve import serve_check
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.model.loader import load_model
from glassbox.service.types import TokenBatch
from tests.helpers import make_tiny_model_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 512 positions: the check's buckets go up to 128 tokens in rehearsal, 256 on a GPU.
    return make_tiny_model_dir(tmp_path_factory.mktemp("gpu-check-model"), max_position_embeddings=512)


def test_import_closure_avoids_what_the_gpu_machine_lacks() -> None:
    # A fresh interpreter: this test process may already hold starlette from other tests.
    probe = (
        "import sys, benchmarks.gpu_check as g; "
        "print(','.join(m for m in ('starlette', 'msgspec', 'uvicorn', 'opentelemetry', 'rich', 'prometheus_client')"
        " if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip() == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_cuda_the_check_stops_with_exit_code_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert gpu_check.main(["--json", str(tmp_path / "out.json")]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()  # nothing measured, nothing written


def test_cpu_rehearsal_runs_every_step_and_writes_json(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gpu-check.json"
    code = gpu_check.main(["--cpu-rehearsal", "--model", str(model_dir), "--iterations", "2", "--skip-pytest",
                           "--skip-serve", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "CPU REHEARSAL" in printed
    data = json.loads(out.read_text())
    assert data["mode"] == "cpu-rehearsal" and data["pass"] is True
    assert [m["name"] for m in data["models"]] == [
        "default-model", "bert-mini-random (rehearsal stand-in for bert-base)"
    ]
    for entry in data["models"]:
        assert [r["dtype"] for r in entry["runs"]] == ["fp32", "fp16"]
        for run in entry["runs"]:
            assert run["kind"] == f"graph-rehearsal-{run['dtype']}"
            parity = run["parity"]
            assert parity["all_replayed"] and parity["exact"] and parity["cross_path"]
            assert all(row["exact"] and row["max_prob_excess"] <= 0 for row in parity["shapes"])
            assert [(row["batch"], row["length"]) for row in run["latency"]] == [(1, 128), (32, 128)]
            assert all(row["graph"]["runs"] == 2 and row["eager"]["runs"] == 2 for row in run["latency"])
            assert run["fallback"] == {"texts": 33, "mode": "eager", "counted": 1, "pass": True}
            assert run["eager_fallbacks"] == {"batch_above_buckets": 1}
            assert run["sdpa_backend"]
    checks = data["checks"]
    assert set(REQUIRED) <= set(checks) and set(checks) == set(CATALOGUE)
    # What the CPU can prove passed; what needs a device ran as far as it could and says so. Nothing failed.
    assert {name for name, c in checks.items() if c["status"] == "passed"} == {
        "pressure_spares_replay", "overflow_runs_eager"}
    assert {c["status"] for c in checks.values()} == {"passed", "needs-gpu"}
    for name in ("graph_parity_exact", "graph_parity_cross_path", "capture_replay_threads", "fallback_wraps_graphs",
                 "capture_oom_degrades", "oom_classify", "bert_base_latency"):
        assert checks[name]["runs"] and all(run["pass"] for run in checks[name]["runs"]), name  # rehearsed
    ladder = checks["capture_oom_degrades"]["runs"][0]
    assert ladder["fewer_buckets"]["start_mode"] == "fewer_buckets"
    assert ladder["nothing_fits"] == {"start_mode": "cpu_fallback", "reason": "oom", "breaker": "open",
                                      "served_on": "cpu"}
    (bert,) = checks["bert_base_latency"]["runs"]
    assert [(row["batch"], row["length"]) for row in bert["throughput"]] == [
        (b, s) for b in (1, 4, 32) for s in (16, 128)]
    assert checks["single_capture_stream"]["reason"] and "runs" not in checks["single_capture_stream"]


def test_a_missing_model_is_reported_as_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLASSBOX_DEFAULT_MODEL_DIR", str(tmp_path / "absent"))
    args = gpu_check.build_parser().parse_args(["--cpu-rehearsal"])
    specs = gpu_check.model_specs(args)
    assert specs[0]["name"] == "default-model" and "not built" in specs[0]["skipped"]
    assert "load" in specs[1]


def test_bert_base_random_model_has_the_promised_size() -> None:
    config = gpu_check.random_config(gpu_check.BERT_BASE)
    dims = (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.intermediate_size)
    assert dims == (768, 12, 12, 3072)
    assert config.max_position_embeddings >= 256  # the server's longest default bucket


def test_fp16_carry_copy_halves_the_weights_and_still_loads(model_dir: Path, tmp_path: Path) -> None:
    dest = tmp_path / "carry" / "model"
    written = write_fp16_model(model_dir, dest)
    assert written < (model_dir / "model.safetensors").stat().st_size
    with safe_open(str(dest / "model.safetensors"), framework="pt") as tensors:
        assert {tensors.get_tensor(k).dtype for k in tensors.keys()} == {torch.float16}  # noqa: SIM118
    original, carried = load_model(model_dir).model, load_model(dest).model
    batch = TokenBatch(ids=np.array([[2, 40, 41, 3]], dtype=np.int64), lengths=np.array([4], dtype=np.int64),
                       truncated=np.zeros(1, dtype=np.bool_))
    np.testing.assert_allclose(EagerEngine(carried).run(batch).logits, EagerEngine(original).run(batch).logits,
                               atol=1e-2, rtol=0)


def test_fp16_carry_copy_keeps_the_evaluation_and_the_held_out_texts(model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(model_dir, source)
    (source / "eval.json").write_text('{"accuracy": 0.8}\n')
    (source / "heldout.jsonl").write_text('{"text": "a fine film", "label": "fresh"}\n')
    dest = tmp_path / "carry" / "model"
    write_fp16_model(source, dest)
    for name in ("eval.json", "heldout.jsonl"):
        assert (dest / name).read_bytes() == (source / name).read_bytes()


@pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk (apt-get install wrk)")
def test_the_carried_tools_are_wrk_and_the_luajit_it_links(tmp_path: Path) -> None:
    assert write_tools(tmp_path) > 0
    names = {path.name for path in (tmp_path / "tools").iterdir()}
    assert "wrk" in names and any(name.startswith("libluajit") for name in names), names
    done = subprocess.run([str(tmp_path / "tools" / "wrk"), "-v"], capture_output=True, text=True, check=False,
                          env={"LD_LIBRARY_PATH": str(tmp_path / "tools")})
    assert done.stdout.startswith("wrk ")  # it loads and runs (-v prints its version, then exits 1)


def test_pytest_bundle_holds_sources_only(tmp_path: Path) -> None:
    size = write_pydeps(tmp_path)
    names = zipfile.ZipFile(tmp_path / "pydeps.zip").namelist()
    assert size < 8 * 2**20
    assert {"pytest/__init__.py", "_pytest/main.py", "pluggy/__init__.py", "pygments/__init__.py"} <= set(names)
    assert not any("__pycache__" in name for name in names)


def test_the_doc_describes_every_check_and_its_status() -> None:
    doc = (ROOT / "docs" / "gpu-check.md").read_text()
    for name in CATALOGUE:
        assert f"| `{name}` |" in doc, f"docs/gpu-check.md has no row for {name}"
    assert "needs-gpu" in doc and "**Status:" in doc  # what the rehearsal shows, and where the check last ran


def test_a_check_fails_if_any_run_fails_and_device_checks_only_rehearse_on_the_cpu() -> None:
    book = CheckBook(rehearsal=True)
    book.record("graph_parity_exact", True, dtype="fp32")
    book.record("graph_parity_exact", False, dtype="fp16")
    book.record("graph_parity_exact", True, dtype="bf16")
    book.record("pressure_spares_replay", True)
    book.record("nvml_lookup", True)
    book.skip("oom_fallback", "run with --oom")
    statuses = {name: c["status"] for name, c in book.to_json().items()}
    assert statuses["graph_parity_exact"] == "failed" and not book.passed
    assert (statuses["pressure_spares_replay"], statuses["nvml_lookup"]) == ("passed", "needs-gpu")
    assert statuses["oom_fallback"] == "needs-gpu" and statuses["single_capture_stream"] == "not-run"
    on_gpu = CheckBook(rehearsal=False)
    on_gpu.record("nvml_lookup", True)
    on_gpu.skip("e2e_server", "dependencies missing")
    assert on_gpu.to_json()["nvml_lookup"]["status"] == "passed"
    assert on_gpu.to_json()["e2e_server"] == {"status": "skipped", "proves": CATALOGUE["e2e_server"][0],
                                              "needs_gpu": True, "reason": "dependencies missing"}


def test_the_e2e_server_check_serves_a_model_under_open_loop_load_on_the_cpu(model_dir: Path) -> None:
    book = CheckBook(rehearsal=True)
    serve_check(book, rehearsal=True, model_dir=model_dir, extra_path=None, seconds_per_rate=1.0)
    check = book.checks["e2e_server"]
    assert check.status == "needs-gpu", check.runs
    (run,) = check.runs
    assert run["device"] == "cpu" and run["ready_s"] > 0
    first = run["steps"][0]
    assert (first["rate"], first["errors"]) == (5.0, 0) and first["ok"] > 0 and first["p99_ms"] > 0
    assert run["best_rate_within_p99_ms"]["limit_ms"] == 10.0
    trace = book.checks["engine_trace"]
    assert trace.status == "needs-gpu", trace.runs
    (traced,) = trace.runs
    assert traced["engine_thread_ops"] > 0 and traced["kernels"] == 0 and traced["gzipped_bytes"] > 0


def test_the_e2e_server_check_names_what_it_cannot_import(monkeypatch: pytest.MonkeyPatch, model_dir: Path) -> None:
    monkeypatch.setattr(gpu_check_serve, "SERVE_MODULES", ("glassbox.service.server", "glassbox_no_such_module"))
    book = CheckBook(rehearsal=False)
    serve_check(book, rehearsal=False, model_dir=model_dir, extra_path=None, seconds_per_rate=1.0)
    check = book.checks["e2e_server"]
    assert check.status == "skipped" and "glassbox_no_such_module" in check.reason and not check.runs


def test_serve_deps_are_what_the_server_imports_less_what_the_gpu_host_has() -> None:
    dists = serve_distributions()
    assert {"starlette", "uvicorn", "msgspec", "httptools", "hdrhistogram", "prometheus-client"} <= set(dists)
    assert not {"torch", "numpy", "tokenizers", "safetensors", "sympy", "pytest", "glassbox-serve"} & set(dists)
    command = pip_download_command({"msgspec": "0.1"}, Path("w"), "3.12")
    assert command[command.index("--python-version") + 1] == "3.12" and "cp312" in command
    assert "--only-binary=:all:" in command and "--no-deps" in command and command[-1] == "msgspec==0.1"


def test_carried_wheels_are_unpacked_as_site_packages(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "demo-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("demo/__init__.py", "VALUE = 42\n")
        wheel.writestr("demo-1.0.dist-info/METADATA", "Name: demo\n")
    site = unpack_wheels(wheels, tmp_path / "site")
    done = subprocess.run([sys.executable, "-c", "import demo; print(demo.VALUE)"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(site)}, check=True)
    assert done.stdout.strip() == "42"
