from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from glassbox.service.cli import main
from glassbox.service.model.build import BuildResult, Recipe, build_model
from glassbox.service.model.data import wheels_in
from tests.service.model.wheels import make_wheel_dir


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuildResult]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model; a second thread only adds waiting on a busy machine
    wheels = wheels_in(make_wheel_dir(tmp_path_factory.mktemp("wheels")))
    recipe = Recipe(epochs=1, batch_size=32, max_length=32)
    yield build_model(tmp_path_factory.mktemp("models") / "minilm-rt-sentiment", recipe, wheels, show_progress=False)
    torch.set_num_threads(before)


def test_info_json_describes_the_default_model(built: BuildResult, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GLASSBOX_DEFAULT_MODEL_DIR", str(built.path))
    assert main(["model", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["path"] == str(built.path)
    assert info["eval"] == built.eval
    assert info["config"]["labels"] == ["negative", "positive"]
    assert (info["config"]["layers"], info["config"]["hidden_size"]) == (2, 32)
    assert info["config"]["max_position_embeddings"] == 128
    assert info["files"]["model.safetensors"] == built.eval["sizes"]["bytes"]


def test_info_human_output_names_the_accuracy(built: BuildResult, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "info", "--model", str(built.path)]) == 0
    out = capsys.readouterr().out
    assert f"accuracy      {built.eval['accuracy']}" in out
    assert "negative, positive" in out


def test_info_on_a_model_glassbox_did_not_build(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "info", "--model", str(tiny_model_dir), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["eval"] is None
    assert info["config"]["labels"] == ["negative", "positive", "neutral"]


def test_info_takes_the_directory_as_inspect_does(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "info", str(tiny_model_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["labels"] == ["negative", "positive", "neutral"]
    assert main(["model", "info", str(tiny_model_dir), "--model", str(tiny_model_dir)]) == 0  # the same one: fine
    capsys.readouterr()
    assert main(["model", "info", str(tiny_model_dir), "--model", str(tiny_model_dir / "other")]) == 2
    assert "two directories given" in capsys.readouterr().err


def test_info_without_a_built_model_fails_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GLASSBOX_DEFAULT_MODEL_DIR", str(tmp_path / "nothing-here"))
    assert main(["model", "info", "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "glassbox model build" in captured.err and "nothing-here" in captured.err


def test_info_with_a_corrupt_eval_json_fails_clearly(built: BuildResult, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in built.path.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    (copy / "eval.json").write_text("{not json")
    assert main(["model", "info", "--model", str(copy)]) == 1
    assert "eval.json is not readable JSON" in capsys.readouterr().err


@pytest.mark.default_model
def test_the_built_in_model_reaches_its_accuracy_target(default_model_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "info", "--model", str(default_model_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["eval"]["accuracy"] >= 0.80
    assert info["config"]["labels"] == ["negative", "positive"]
    heldout = (default_model_path / "heldout.jsonl").read_text().splitlines()
    assert len(heldout) == info["eval"]["n_heldout"] >= 1000


@pytest.mark.parametrize("missing", ["tokenizer.json", "model.safetensors"])
def test_info_on_a_partial_directory_fails_as_serve_would(tiny_model_dir: Path, tmp_path: Path, missing: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    partial = tmp_path / "partial"
    partial.mkdir()
    for path in tiny_model_dir.iterdir():
        if path.is_file() and path.name != missing:
            (partial / path.name).write_bytes(path.read_bytes())
    assert main(["model", "info", "--model", str(partial)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"glassbox model info: {partial} cannot be served: ")
    assert missing in captured.err and f"glassbox model inspect {partial}" in captured.err
