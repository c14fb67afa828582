from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from glassbox.service.cli import main
from glassbox.service.model.loader import load_model
from glassbox.service.tokenizer import TextTokenizer
from tests.families import FAMILY_CASES, save_family_model
from tests.helpers import WORDS


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """A tiny model; on a busy 2-core machine a second thread mostly waits for the first."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def mix_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    lines = []
    for i in range(37):
        words = [WORDS[int(k)] for k in rng.integers(0, len(WORDS), size=int(rng.integers(1, 60)))]
        lines.append(json.dumps({"text": " ".join(words), "label": ["negative", "positive", "neutral"][i % 3]}))
    path = tmp_path_factory.mktemp("mix") / "mix.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _bench(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["bench", "engine", "--json", "--repeat", "2", *args]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def _expected_accuracy(model_dir: Path, mix: Path) -> float:
    loaded = load_model(model_dir)
    lines = [json.loads(line) for line in mix.read_text().splitlines()]
    tokens = TextTokenizer.from_file(loaded.tokenizer_file, 256, 128).encode([x["text"] for x in lines])
    mask = torch.from_numpy(np.arange(tokens.max_length)[None, :] < tokens.lengths[:, None])
    with torch.inference_mode():
        predicted = loaded.model(torch.from_numpy(tokens.ids), mask).argmax(-1).numpy()
    labels = np.array([loaded.labels.index(x["label"]) for x in lines])
    return float((predicted == labels).mean())


def test_bench_reports_throughput_buckets_and_accuracy(tiny_model_dir: Path, mix_file: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    report = _bench(capsys, "--model", str(tiny_model_dir), "--texts", str(mix_file), "--batch-size", "8")
    assert report["engine"] == "eager-fp32" and report["device"] == "cpu"
    assert report["mix"] == {"source": str(mix_file), "texts": 37, "batch_size": 8, "sorted": True,
                             "max_length": 128, "labelled": True}
    assert report["throughput_seq_per_s"] > 0 and len(report["throughput_per_pass"]) == 2
    assert 0 < report["latency_ms"]["p50"] <= report["latency_ms"]["p99"]
    assert report["batches"] == 5 and report["texts"] == 37
    assert sum(b["batches"] for b in report["buckets"].values()) == 5
    assert sum(b["texts"] for b in report["buckets"].values()) == 37
    for key, bucket in report["buckets"].items():
        batch, length = (int(x) for x in key.split("x"))
        assert batch == 8 and length in (16, 32, 64)
        assert 0 < bucket["p50_ms"] <= bucket["p99_ms"] and bucket["seq_per_s"] > 0
    # The accuracy is the model's own on these texts, whatever the batching.
    assert report["accuracy"] == pytest.approx(_expected_accuracy(tiny_model_dir, mix_file), abs=1e-4)
    assert report["machine"]["torch"] == torch.__version__


def test_unsorted_batches_pad_more(tiny_model_dir: Path, mix_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ("--model", str(tiny_model_dir), "--texts", str(mix_file), "--batch-size", "8")
    ordered = _bench(capsys, *common)
    shuffled = _bench(capsys, *common, "--no-sort")
    assert shuffled["mix"]["sorted"] is False
    assert shuffled["padding_ratio"] > ordered["padding_ratio"]
    assert shuffled["accuracy"] == ordered["accuracy"]


def test_compare_runs_fp32_bf16_and_int8_side_by_side(tiny_model_dir: Path, mix_file: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    report = _bench(capsys, "--model", str(tiny_model_dir), "--texts", str(mix_file), "--compare")
    assert list(report["variants"]) == ["eager-fp32", "eager-bf16", "eager-int8"]
    assert [(c["baseline"], c["candidate"]) for c in report["comparisons"]] == [
        ("eager-fp32", "eager-bf16"), ("eager-fp32", "eager-int8")]
    fp32 = report["variants"]["eager-fp32"]["accuracy"]
    for comparison in report["comparisons"]:
        assert comparison["speedup"] > 0
        assert 0 <= comparison["agreement"] <= 1
        candidate = report["variants"][comparison["candidate"]]["accuracy"]
        assert comparison["accuracy_delta"] == pytest.approx(candidate - fp32, abs=1e-4)


def test_dtype_picks_the_cpu_number_format_and_says_why(tiny_model_dir: Path, mix_file: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    report = _bench(capsys, "--model", str(tiny_model_dir), "--texts", str(mix_file), "--dtype", "bf16")
    assert report["engine"] == "eager-bf16"
    assert report["cpu_precision"]["precision"] == "bf16"
    assert report["cpu_precision"]["reason"].startswith("--cpu-dtype bf16 was asked for")
    # auto on a model without heldout.jsonl: fp32, whatever the CPU (nothing to check bf16's answers on)
    assert _bench(capsys, "--model", str(tiny_model_dir), "--texts", str(mix_file))["engine"] == "eager-fp32"


def test_compare_with_a_format_of_its_own_is_a_usage_error(tiny_model_dir: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "engine", "--model", str(tiny_model_dir), "--compare", "--dtype", "bf16"]) == 2
    assert "--compare runs fp32, bf16 and int8 itself" in capsys.readouterr().err


def test_default_mix_is_the_models_heldout_file(tiny_model_dir: Path, mix_file: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    shutil.copy(mix_file, model / "heldout.jsonl")
    monkeypatch.setenv("GLASSBOX_DEFAULT_MODEL_DIR", str(model))
    report = _bench(capsys, "--quantize", "int8", "--batch-size", "16")
    assert report["mix"]["source"] == str(model / "heldout.jsonl")
    assert report["engine"] == "eager-int8"
    assert 0.0 <= report["accuracy"] <= 1.0


def test_without_heldout_file_a_synthetic_mix_is_timed(tiny_model_dir: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "engine", "--json", "--repeat", "2", "--model", str(tiny_model_dir)]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["mix"]["source"] == "synthetic (256 texts, seed 0)" and report["mix"]["labelled"] is False
    assert report["texts"] == 256 and report["accuracy"] is None and report["throughput_seq_per_s"] > 0
    assert "heldout.jsonl; timing a synthetic mix" in err


def test_a_missing_texts_file_is_a_clear_error(tiny_model_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "engine", "--model", str(tiny_model_dir), "--texts", str(tmp_path / "nope.jsonl")]) == 2
    assert "nope.jsonl does not exist" in capsys.readouterr().err


def test_a_texts_path_that_is_a_directory_or_binary_is_a_clear_usage_error(
        tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "engine", "--model", str(tiny_model_dir), "--texts", str(tmp_path)]) == 2
    assert f"{tmp_path} is not a file" in capsys.readouterr().err  # it exists: 'does not exist' misled
    binary = tmp_path / "garbage.bin"
    binary.write_bytes(b"\xff\xfe\x00" + bytes(range(256)))
    assert main(["bench", "engine", "--model", str(tiny_model_dir), "--texts", str(binary)]) == 2
    assert capsys.readouterr().err == (f"glassbox bench engine: {binary} is not UTF-8 text "
                                       f"(a mix is JSON lines or plain lines)\n")


@pytest.mark.parametrize(("flags", "message"), [
    (["--max-length", "0"], "max_length must be positive"),
    (["--threads", "-2"], "threads must be 0 (auto) or positive"),
])
def test_settings_that_do_not_validate_are_a_usage_error(tiny_model_dir: Path, flags: list[str], message: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # load_settings raised ValueError('invalid settings: ...'): a traceback and exit 1 for a flag error
    assert main(["bench", "engine", "--model", str(tiny_model_dir), *flags]) == 2
    assert capsys.readouterr().err == f"glassbox bench engine: invalid settings: {message}\n"


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_bench_engine_runs_every_family(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = save_family_model(tmp_path / case, case, "multi").path
    report = _bench(capsys, "--model", str(path), "--compare", "--batch-size", "32", "--max-length", "64")
    assert set(report["variants"]) == {"eager-fp32", "eager-bf16", "eager-int8"}
    assert all(v["texts"] == 256 and v["throughput_seq_per_s"] > 0 for v in report["variants"].values())
    assert report["mix"]["max_length"] == 64


def test_int8_on_cuda_is_refused(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "engine", "--model", str(tiny_model_dir), "--device", "cuda", "--compare"]) == 2
    assert "for the CPU engine" in capsys.readouterr().err


def test_flags_that_do_not_add_up_are_a_usage_error_like_bench(tiny_model_dir: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "engine", "--model", str(tiny_model_dir), "--repeat", "0"]) == 2
    assert "--repeat and --batch-size must be at least 1" in capsys.readouterr().err
    assert main(["bench", "--target", "http://127.0.0.1:1", "--rate", "0", "--duration", "1"]) == 2  # the same code
    capsys.readouterr()
    assert main(["bench", "engine", "--model", str(tiny_model_dir / "nothing-here")]) == 1  # not a usage error


@pytest.mark.default_model
def test_int8_and_bf16_keep_the_default_models_accuracy(default_model_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # The default batching (length-sorted, 32); docs/benchmarks/2026-11-30-cpu-fp32-int8.md records the others too.
    report = _bench(capsys, "--model", str(default_model_path), "--compare", "--repeat", "1")
    fp32 = report["variants"]["eager-fp32"]["accuracy"]
    assert fp32 >= 0.80
    bf16, int8 = report["comparisons"]
    assert abs(int8["accuracy_delta"]) <= 0.01
    # bf16's own gate (service/engines/precision.py), on the whole held-out file; on any CPU: without native bf16
    # torch computes the same format by conversion, only slower.
    assert bf16["accuracy_delta"] >= -0.005 and bf16["agreement"] >= 0.995
