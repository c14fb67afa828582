"""The Classifier API with the batch shapes Ray Data and Spark hand it, and the docs' Ray Data and Spark examples run
in local mode (where ray / pyspark are installed: the `ray` and `spark` extras)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from glassbox.service.bulk import Classifier, classify_pandas
from glassbox.service.errors import InvalidRequestError
from tests.helpers import WORDS

ROOT = Path(__file__).resolve().parents[3]


def texts(count: int) -> list[str]:
    rng = np.random.default_rng(3)
    return [" ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), size=int(n)))
            for n in rng.integers(1, 30, size=count)]


@pytest.fixture(scope="module")
def classifier(tiny_model_dir: Path) -> Classifier:
    return Classifier(tiny_model_dir, engine_threads=1, max_batch_size=8, batch_tokens=128)


def expected(classifier: Classifier, batch: list[str]) -> list[dict[str, Any]]:
    """Each text alone, so no batching or sorting can hide a row mix-up."""
    return [classifier.predict([t])[0] for t in batch]


def test_predict_answers_in_input_order(classifier: Classifier) -> None:
    batch = texts(40)
    got = classifier.predict(batch)
    want = expected(classifier, batch)
    assert [g["label"] for g in got] == [w["label"] for w in want]
    assert [g["score"] for g in got] == pytest.approx([w["score"] for w in want], abs=1e-5)
    assert classifier(batch) == got  # a plain list of texts is the same call


def test_dict_of_numpy_arrays_as_ray_data_passes_it(classifier: Classifier) -> None:
    batch = texts(25)
    ids = np.arange(25, dtype=np.int64)
    out = classifier({"id": ids, "text": np.array(batch, dtype=object)})
    assert set(out) == {"id", "text", "label", "score", "truncated"}
    assert out["id"] is ids and len(out["label"]) == 25
    assert out["label"].tolist() == [w["label"] for w in expected(classifier, batch)]
    assert out["score"].dtype == np.float64 and out["truncated"].dtype == np.bool_


def test_pairs_from_a_column_and_all_scores(tiny_model_dir: Path) -> None:
    scorer = Classifier(tiny_model_dir, engine_threads=1, pair_column="second", all_scores=True)
    out = scorer({"text": ["good movie", "bad plot"], "second": ["the end", None]})
    assert {"score_negative", "score_positive", "score_neutral"} <= set(out)
    alone = scorer.predict(["good movie"], ["the end"])[0]
    assert out["score_positive"][0] == pytest.approx(alone["scores"]["positive"], abs=1e-6)
    assert out["label"][1] == scorer.predict(["bad plot"])[0]["label"]


def test_a_null_text_is_a_clear_error(classifier: Classifier) -> None:
    with pytest.raises(InvalidRequestError, match="row 1 of column 'text' is null"):
        classifier({"text": ["good", None]})
    with pytest.raises(InvalidRequestError, match="cannot classify a int"):
        classifier(5)


def test_empty_batch(classifier: Classifier) -> None:
    out = classifier({"text": np.array([], dtype=object)})
    assert len(out["label"]) == 0 and len(out["score"]) == 0


def test_pandas_and_pyarrow_batches(classifier: Classifier) -> None:
    pandas = pytest.importorskip("pandas", reason="pandas is in the dev and bulk extras")
    pyarrow = pytest.importorskip("pyarrow", reason="pyarrow is in the dev and bulk extras")
    batch = texts(12)
    labels = [w["label"] for w in expected(classifier, batch)]
    frame = classifier(pandas.DataFrame({"id": range(12), "text": batch}))
    assert list(frame.columns) == ["id", "text", "label", "score", "truncated"]
    assert frame["label"].tolist() == labels
    table = classifier(pyarrow.table({"id": list(range(12)), "text": batch}))
    assert isinstance(table, pyarrow.Table) and table.column("label").to_pylist() == labels
    record_batch = classifier(pyarrow.RecordBatch.from_pydict({"text": batch}))
    assert isinstance(record_batch, pyarrow.RecordBatch) and record_batch.column(1).to_pylist() == labels


def test_classify_pandas_builds_one_model_per_process(tiny_model_dir: Path) -> None:
    pandas = pytest.importorskip("pandas", reason="pandas is in the dev and bulk extras")
    score = classify_pandas(tiny_model_dir, engine_threads=1)
    frames = [pandas.DataFrame({"text": texts(5)}), pandas.DataFrame({"text": texts(3)})]
    out = list(score(iter(frames)))
    assert [len(f) for f in out] == [5, 3] and "label" in out[0]
    again = classify_pandas(tiny_model_dir, engine_threads=1)
    list(again(iter(frames[:1])))
    from glassbox.service.bulk.classifier import _shared

    assert _shared.cache_info().currsize == 1  # the second partition function reused the first's model


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"glassbox_example_{name}", ROOT / "docs" / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ray_data_example_in_local_mode(tiny_model_dir: Path, classifier: Classifier) -> None:
    ray = pytest.importorskip("ray", reason="Ray Data is the `ray` extra: pip install -e '.[ray]'")
    pytest.importorskip("ray.data")
    module = example("ray_data")
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        batch = texts(60)
        dataset = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(batch)])
        rows = module.classify_dataset(dataset, str(tiny_model_dir), actors=2, batch_size=16).take_all()
    finally:
        ray.shutdown()
    by_id = {row["id"]: row for row in rows}
    assert sorted(by_id) == list(range(60))  # every row once
    want = expected(classifier, batch)
    assert [by_id[i]["label"] for i in range(60)] == [w["label"] for w in want]
    assert [by_id[i]["score"] for i in range(60)] == pytest.approx([w["score"] for w in want], abs=1e-5)


def test_spark_example_in_local_mode(tiny_model_dir: Path, classifier: Classifier,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark", reason="Spark is the `spark` extra: pip install -e '.[spark]'")
    pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime")
    from pyspark.sql import SparkSession

    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    module = example("spark")
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    try:
        batch = texts(40)
        frame = spark.createDataFrame(list(enumerate(batch)), "id long, text string").repartition(3)
        rows = module.classify_frame(frame, str(tiny_model_dir)).collect()
    finally:
        spark.stop()
    by_id = {row["id"]: row for row in rows}
    assert sorted(by_id) == list(range(40))
    want = expected(classifier, batch)
    assert [by_id[i]["label"] for i in range(40)] == [w["label"] for w in want]
    assert [by_id[i]["score"] for i in range(40)] == pytest.approx([w["score"] for w in want], abs=1e-5)


def test_predict_refuses_what_is_not_a_list_of_texts(classifier: Classifier) -> None:
    """A bare string is a sequence of strings: predict("a review") scored each character and returned one result per
    character. None among the texts, or pairs of another length, raised bare TypeError / ValueError from inside."""
    with pytest.raises(InvalidRequestError, match="not one str"):
        classifier.predict("a gorgeous, witty film")
    with pytest.raises(InvalidRequestError, match="row 1 of column 'texts' is null"):
        classifier.predict(["good", None])  # type: ignore[list-item]
    with pytest.raises(InvalidRequestError, match="2 texts but 1 pairs"):
        classifier.predict(["good", "bad"], ["the plot"])
    with pytest.raises(InvalidRequestError, match="not one str"):
        classifier.classify(["good"], "the plot")
    assert len(classifier.predict(["good", "bad"], ["the plot", None])) == 2
