"""Bringing real directories: sharded safetensors, pickled checkpoints and `glassbox model convert`, and
`glassbox model inspect` on good and broken directories (each broken one: one clear problem naming the file)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from glassbox.service.cli import main
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.errors import ModelLoadError
from glassbox.service.model.checkpoint import PICKLE_FILE, WEIGHTS_FILE, WEIGHTS_INDEX
from glassbox.service.model.convert import convert
from glassbox.service.model.inspection import inspect_directory
from glassbox.service.model.loader import load_model
from tests.families import FAMILY_CASES, HEADS, reference_model, save_family_model

TEXTS = ["a very good movie", "le film était très bien", ""]


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bring")
    return {case: save_family_model(root / case, case, "multi").path for case in FAMILY_CASES}


def logits(path: Path) -> np.ndarray:
    loaded = load_model(path)
    return EagerEngine(loaded.model, "cpu", executor="python").run(loaded.text_tokenizer(32).encode(TEXTS)).logits


def copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def pickled(source: Path, target: Path) -> Path:
    """The directory as an older save_pretrained left it: pytorch_model.bin, no safetensors."""
    copy(source, target)
    torch.save(load_file(str(target / WEIGHTS_FILE)), target / PICKLE_FILE)
    (target / WEIGHTS_FILE).unlink()
    return target


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_inspect_describes_every_family(family_dirs: dict[str, Path], case: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "inspect", str(family_dirs[case]), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    reference = reference_model(case, "multi")
    assert report["servable"] is True and report["problems"] == []
    assert report["family"] == ("roberta" if case in ("xlm-roberta", "camembert") else case)
    assert report["model_type"] == case and report["problem_type"] == "multi_label_classification"
    assert report["labels"] == list(HEADS["multi"][1]) and report["max_length"] == 64
    assert report["parameters"] == sum(p.numel() for p in reference.state_dict().values()
                                       if p.dtype.is_floating_point)
    assert report["weights"] == WEIGHTS_FILE and report["pairs"] is True
    assert main(["model", "inspect", str(family_dirs[case])]) == 0
    human = capsys.readouterr().out
    assert "servable      yes" in human and "multi_label_classification, 4 output(s)" in human


def test_sharded_safetensors_load_and_give_the_same_logits(family_dirs: dict[str, Path], tmp_path: Path) -> None:
    sharded = save_family_model(tmp_path / "sharded", "roberta", "multi", max_shard_size="20KB").path
    index = json.loads((sharded / WEIGHTS_INDEX).read_text())
    assert not (sharded / WEIGHTS_FILE).exists() and len(set(index["weight_map"].values())) > 2
    np.testing.assert_array_equal(logits(sharded), logits(family_dirs["roberta"]))
    report = inspect_directory(sharded)
    assert report.servable and report.weights is not None and "shard(s) listed in" in report.weights


def _drop_a_shard(path: Path) -> None:
    shard = sorted(json.loads((path / WEIGHTS_INDEX).read_text())["weight_map"].values())[0]
    (path / shard).unlink()


def _misfile_a_tensor(path: Path) -> None:
    index = json.loads((path / WEIGHTS_INDEX).read_text())
    shards = sorted(set(index["weight_map"].values()), key=list(index["weight_map"].values()).count, reverse=True)
    name = next(n for n, s in index["weight_map"].items() if s == shards[0])  # from the fullest shard, which stays
    index["weight_map"][name] = shards[1]
    (path / WEIGHTS_INDEX).write_text(json.dumps(index))


def _list_a_ghost(path: Path) -> None:
    index = json.loads((path / WEIGHTS_INDEX).read_text())
    index["weight_map"]["roberta.ghost.weight"] = sorted(index["weight_map"].values())[0]
    (path / WEIGHTS_INDEX).write_text(json.dumps(index))


@pytest.mark.parametrize(("damage", "words"), [
    (_drop_a_shard, "lists the shard"),
    (_misfile_a_tensor, "puts in"),
    (_list_a_ghost, "lists tensors no shard holds: roberta.ghost.weight"),
    (lambda p: (p / WEIGHTS_INDEX).write_text("{}"), 'has no "weight_map"'),
    (lambda p: (p / WEIGHTS_INDEX).write_text('{"weight_map": {"a": "../x.safetensors"}}'), "not a .safetensors file"),
    (lambda p: (p / WEIGHTS_INDEX).write_text("[not json"), "not readable JSON"),
], ids=["missing shard", "misfiled tensor", "ghost tensor", "no map", "escaping path", "not json"])
def test_broken_shards_are_one_clear_error(tmp_path: Path, damage: Callable[[Path], object], words: str) -> None:
    sharded = save_family_model(tmp_path / "sharded", "roberta", "single", max_shard_size="20KB").path
    damage(sharded)
    with pytest.raises(ModelLoadError) as caught:
        load_model(sharded)
    assert words in caught.value.message and str(sharded) in caught.value.message
    report = inspect_directory(sharded)
    assert not report.servable and any(words in problem for problem in report.problems)


def test_a_pickled_checkpoint_is_refused_with_how_to_convert_then_converted(
    family_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = pickled(family_dirs["electra"], tmp_path / "old")
    with pytest.raises(ModelLoadError) as caught:
        load_model(old)
    message = caught.value.message
    assert str(old / PICKLE_FILE) in message and f"glassbox model convert {old}" in message
    assert main(["model", "inspect", str(old)]) == 1
    assert f"glassbox model convert {old}" in capsys.readouterr().out
    assert main(["model", "convert", str(old)]) == 0
    assert "servable: electra multi_label_classification, 4 labels" in capsys.readouterr().out
    assert (old / PICKLE_FILE).exists()  # left in place
    np.testing.assert_array_equal(logits(old), logits(family_dirs["electra"]))
    assert main(["model", "convert", str(old)]) == 1  # safetensors exist now: --force to replace them
    assert "--force" in capsys.readouterr().err
    assert main(["model", "convert", str(old), "--force"]) == 0


def test_convert_never_runs_code_from_the_pickle(family_dirs: dict[str, Path], tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str, str]]:
            return (open, (str(marker), "w"))  # creates the marker if ever unpickled with code execution

    old = pickled(family_dirs["bert"], tmp_path / "old")
    state = torch.load(old / PICKLE_FILE, weights_only=True)
    torch.save({**state, "payload": Payload()}, old / PICKLE_FILE)
    with pytest.raises(ModelLoadError) as caught:
        convert(old)
    assert "cannot be read safely (weights_only=True)" in caught.value.message
    assert not marker.exists() and not (old / WEIGHTS_FILE).exists()


@pytest.mark.parametrize(("content", "words"), [
    ([torch.zeros(2)], "does not hold a state dict"),
    (b"not a pickle at all", "cannot be read safely"),
    ({}, "holds no tensors"),
], ids=["a list", "garbage", "empty"])
def test_convert_refuses_what_is_not_a_state_dict(tmp_path: Path, content: object, words: str) -> None:
    tmp_path.joinpath("config.json").write_text("{}")
    if isinstance(content, bytes):
        (tmp_path / PICKLE_FILE).write_bytes(content)
    else:
        torch.save(content, tmp_path / PICKLE_FILE)
    with pytest.raises(ModelLoadError) as caught:
        convert(tmp_path)
    assert words in caught.value.message


def test_convert_of_sharded_pickles_and_tied_weights(family_dirs: dict[str, Path], tmp_path: Path) -> None:
    old = copy(family_dirs["distilbert"], tmp_path / "old")
    state = load_file(str(old / WEIGHTS_FILE))
    (old / WEIGHTS_FILE).unlink()
    names = sorted(state)
    halves = {"pytorch_model-1.bin": names[: len(names) // 2], "pytorch_model-2.bin": names[len(names) // 2:]}
    first = {name: state[name] for name in halves["pytorch_model-1.bin"]}
    # Tied weights: two names, one tensor (one storage), as a pickle keeps them; safetensors refuses shared storage.
    tied, twin = next((a, b) for a in first for b in first if a < b and first[a].shape == first[b].shape)
    first[twin] = first[tied]
    torch.save(first, old / "pytorch_model-1.bin")
    torch.save({name: state[name] for name in halves["pytorch_model-2.bin"]}, old / "pytorch_model-2.bin")
    (old / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"weight_map": {name: file for file, members in halves.items() for name in members}}))
    convert(old)
    converted = load_file(str(old / WEIGHTS_FILE))
    assert set(converted) == set(state)
    assert torch.equal(converted[twin], state[tied]) and torch.equal(converted[names[-1]], state[names[-1]])


@pytest.mark.parametrize(("damage", "file", "words"), [
    (lambda p: (p / "config.json").write_text('{"model_type": "gpt2"}'), "config.json", "not supported"),
    (lambda p: (p / "tokenizer.json").unlink(), "tokenizer.json", "missing"),
    (lambda p: (p / WEIGHTS_FILE).write_bytes(b"junk"), WEIGHTS_FILE, "not a readable safetensors file"),
    (lambda p: (p / WEIGHTS_FILE).unlink(), WEIGHTS_FILE, "missing"),
], ids=["family", "tokenizer", "weights", "no weights"])
def test_inspect_names_the_file_and_the_problem(family_dirs: dict[str, Path], tmp_path: Path,
                                                damage: Callable[[Path], object], file: str, words: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    broken = copy(family_dirs["bert"], tmp_path / "broken")
    damage(broken)
    assert main(["model", "inspect", str(broken), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["servable"] is False
    (problem,) = report["problems"]
    assert str(broken / file) in problem and words in problem


def test_a_file_given_for_the_directory_is_not_a_directory_not_missing(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # the path exists: inspect and convert used to say it did not, as the loader did
    given = tmp_path / "a.txt"
    given.write_text("good film\n")
    expected = f"model directory {given} is not a directory (a model is a save_pretrained directory)"
    assert inspect_directory(given).problems == [expected]
    with pytest.raises(ModelLoadError) as caught:
        convert(given)
    assert caught.value.message == expected
    assert main(["model", "inspect", str(given), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["problems"] == [expected]
    nowhere = tmp_path / "nowhere"
    assert inspect_directory(nowhere).problems == [f"model directory {nowhere} does not exist"]
