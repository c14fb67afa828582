"""service/model/reference.py: a model's reference distributions (`glassbox model reference`, reference.json), read
back by the server and `glassbox model inspect`; and the drift index."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from glassbox.service.errors import ModelLoadError
from glassbox.service.model.build import add_reference
from glassbox.service.model.inspection import human, inspect_directory
from glassbox.service.model.reference import (
    LENGTH_BOUNDS,
    REFERENCE_FILE,
    SCORE_BOUNDS,
    binned,
    compute_reference,
    psi,
    read_reference,
    read_texts,
    write_reference,
)

ROOT = Path(__file__).resolve().parents[3]
TEXTS = ["a good movie", "the worst film and a boring plot", "great acting", "slow and sad", "fun music"] * 8


@pytest.fixture
def model(tiny_model_dir: Path, tmp_path: Path) -> Path:
    directory = tmp_path / "model"
    shutil.copytree(tiny_model_dir, directory)
    return directory


def test_bins_are_prometheus_le_bins_and_psi_is_zero_for_the_same_shares() -> None:
    assert binned([0.1, 0.100001, 0.5, 1.0], SCORE_BOUNDS).tolist()[:6] == [1, 1, 0, 0, 1, 0]
    assert binned([600], LENGTH_BOUNDS)[-1] == 1  # beyond the last bound: +Inf
    assert psi([10, 30], [100, 300]) == pytest.approx(0.0, abs=1e-3)
    assert psi([30, 10], [100, 300]) > 0.25
    assert psi([0, 40], [100, 300]) < float("inf")  # an empty bin is smoothed, never infinite


def test_a_reference_is_counted_written_read_back_and_shown_by_inspect(model: Path) -> None:
    reference = compute_reference(model, TEXTS, "test texts")
    assert reference.texts == len(TEXTS) and reference.labels == ("negative", "positive", "neutral")
    assert sum(reference.distributions["labels"]) == len(TEXTS) == sum(reference.distributions["score"])
    assert sum(reference.distributions["length"]) == len(TEXTS)
    write_reference(model, reference)
    assert read_reference(model) == reference
    assert f"reference     {len(TEXTS)} texts from test texts" in human(inspect_directory(model))


def test_a_model_without_one_says_so_and_a_broken_one_is_named_not_served_as_a_reference(model: Path) -> None:
    assert read_reference(model) is None
    assert "none (no reference.json" in human(inspect_directory(model))
    (model / REFERENCE_FILE).write_text('{"format": 1, "distributions": {}}')
    with pytest.raises(ModelLoadError, match="cannot be read as a reference"):
        read_reference(model)
    report = inspect_directory(model)
    assert report.servable and report.reference is not None and report.reference.startswith("unreadable")
    write_reference(model, compute_reference(model, TEXTS[:5], "five"))
    raw = json.loads((model / REFERENCE_FILE).read_text())
    raw["distributions"]["labels"] = [1, 2]  # three labels
    (model / REFERENCE_FILE).write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match="'labels' does not have 3 counts"):
        read_reference(model)


def test_texts_come_from_json_lines_or_plain_lines(tmp_path: Path) -> None:
    path = tmp_path / "texts"
    path.write_text('{"text": "one", "label": "fresh"}\n\nplain two\n{"text": "three"}\n')
    assert read_texts(path, 10) == ["one", "plain two", "three"]
    assert read_texts(path, 2) == ["one", "plain two"]
    path.write_text('{"label": "fresh"}\n')
    with pytest.raises(ModelLoadError, match=r"texts:1: a JSON line needs a \"text\" string"):
        read_texts(path, 10)


def test_glassbox_model_reference_writes_the_file_the_server_reads(model: Path, tmp_path: Path) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    done = subprocess.run([sys.executable, "-m", "glassbox.service", "model", "reference", str(model), "--texts",
                           str(texts)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {model / REFERENCE_FILE}: {len(TEXTS)} texts; answers negative")
    reference = read_reference(model)
    assert reference is not None and reference.source == "texts.txt" and reference.texts == len(TEXTS)
    missing = subprocess.run([sys.executable, "-m", "glassbox.service", "model", "reference", str(model), "--texts",
                              str(tmp_path / "nothing.txt")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                             check=False)
    assert missing.returncode == 1 and "nothing.txt" in missing.stderr and "Traceback" not in missing.stderr


def test_a_built_model_without_a_reference_gets_one_from_its_held_out_texts(model: Path) -> None:
    (model / "heldout.jsonl").write_text("".join(json.dumps({"text": t, "label": "fresh"}) + "\n" for t in TEXTS))
    add_reference(model)
    reference = read_reference(model)
    assert reference is not None and reference.texts == len(TEXTS) and "heldout.jsonl" in reference.source
    np.testing.assert_array_equal(reference.distributions["labels"],
                                  compute_reference(model, TEXTS, "same").distributions["labels"])
