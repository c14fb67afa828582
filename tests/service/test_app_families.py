"""End to end through the HTTP routes, one tiny model per family (and per head), against transformers' own
text-classification pipeline on the same directory: single texts and text pairs on /v1/classify, /predict, KServe
v2 (tritonclient with two BYTES inputs, over a real socket) and /rerank for the one-output heads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from transformers import pipeline

from glassbox.service.app import create_app
from tests.families import HEADS, save_family_model
from tests.service.apptools import BOUND_S, app_settings, live_server, ready_client, wait_ready

# (family case, head): every family, every head at least once.
SERVED = [("bert", "single"), ("distilbert", "multi"), ("roberta", "regression"), ("xlm-roberta", "single"),
          ("camembert", "multi"), ("electra", "regression"), ("electra", "single")]
TEXTS = ["a very good movie", "what is deep learning?", "le film était très bien", "sad music, funny cast"]
SECONDS: list[str | None] = [None, "deep learning is a kind of machine learning", None, "the plot"]
TOLERANCE = 1e-4


def settings_for(path: Path) -> Any:
    # The models' whole 64 positions: nothing here is truncated, so transformers' untruncated pipeline compares.
    return app_settings(path, max_length=64, length_buckets=(16, 32, 64))


@pytest.fixture(scope="module")
def directories(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("served-families")
    return {(case, head): save_family_model(root / f"{case}-{head}", case, head, seed=5).path
            for case, head in SERVED}


def reference(path: Path) -> list[list[dict[str, Any]]]:
    """transformers' pipeline on TEXTS/SECONDS: every label with its score, best first, one list per input."""
    classify = pipeline("text-classification", model=str(path), tokenizer=str(path), top_k=None)
    inputs = [text if second is None else {"text": text, "text_pair": second} for text, second in zip(
        TEXTS, SECONDS, strict=True)]
    return classify(inputs)  # type: ignore[no-any-return]


def assert_ranked(answer: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert [a["label"] for a in answer] == [w["label"] for w in want]
    np.testing.assert_allclose([a["score"] for a in answer], [w["score"] for w in want], rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize(("case", "head"), SERVED, ids=[f"{c}-{h}" for c, h in SERVED])
def test_classify_and_predict_match_the_transformers_pipeline(directories: dict[tuple[str, str], Path], case: str,
                                                               head: str) -> None:
    path = directories[(case, head)]
    want = reference(path)
    with ready_client(create_app(settings_for(path))) as client:
        body: dict[str, Any] = {"texts": TEXTS, "text_pairs": SECONDS}
        if head != "regression":
            body["all_scores"] = True
        classified = client.post("/v1/classify", json=body)
        assert classified.status_code == 200, classified.text
        results = classified.json()["results"]
        predicted = client.post("/predict", json={"inputs": [[t] if s is None else [t, s]
                                                             for t, s in zip(TEXTS, SECONDS, strict=True)]})
        assert predicted.status_code == 200
        assert not any(result["truncated"] for result in results)
        for row, expected in enumerate(want):
            if head == "regression":
                assert "label" not in results[row]
                assert results[row]["score"] == pytest.approx(expected[0]["score"], abs=TOLERANCE)
            else:
                assert results[row]["label"] == expected[0]["label"]
                assert_ranked(results[row]["scores"], expected)
            assert_ranked(predicted.json()[row], expected)
        info = client.get("/info").json()["glassbox"]
        assert (info["problem_type"], info["model_type"]) == (HEADS[head][0], case)


@pytest.mark.parametrize(("case", "head"), [("roberta", "regression"), ("electra", "regression")])
def test_one_output_models_rerank(directories: dict[tuple[str, str], Path], case: str, head: str) -> None:
    path = directories[(case, head)]
    classify = pipeline("text-classification", model=str(path), tokenizer=str(path), top_k=None)
    query, texts = "what is deep learning?", ["deep learning is a kind of machine learning", "the plot", "paris"]
    scores = [classify({"text": query, "text_pair": text})[0]["score"] for text in texts]
    with ready_client(create_app(settings_for(path))) as client:
        ranks = client.post("/", json={"query": query, "texts": texts}).json()  # a reranker's base URL reranks
    order = sorted(range(len(texts)), key=lambda i: -scores[i])
    assert [r["index"] for r in ranks] == order
    np.testing.assert_allclose([r["score"] for r in ranks], [scores[i] for i in order], rtol=0, atol=TOLERANCE)


@pytest.fixture(scope="module")
def electra_server(directories: dict[tuple[str, str], Path]) -> Iterator[tuple[str, Path]]:
    path = directories[("electra", "single")]
    settings = settings_for(path)
    with live_server(create_app(settings), settings) as live:
        wait_ready(lambda p: httpx.get(live.base_url + p, timeout=BOUND_S))
        yield f"127.0.0.1:{live.port}", path


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_sends_pairs_as_a_second_input(electra_server: tuple[str, Path], binary: bool) -> None:
    url, path = electra_server
    pairs = [(t, s) for t, s in zip(TEXTS, SECONDS, strict=True) if s is not None]
    inputs = []
    for name, values in (("text", [a for a, _ in pairs]), ("text_pair", [b for _, b in pairs])):
        tensor = triton.InferInput(name, [len(values)], "BYTES")
        tensor.set_data_from_numpy(np.array([v.encode() for v in values], dtype=np.object_), binary_data=binary)
        inputs.append(tensor)
    client = triton.InferenceServerClient(url, connection_timeout=BOUND_S, network_timeout=BOUND_S)
    try:
        metadata = client.get_model_metadata(path.name)
        assert [i["name"] for i in metadata["inputs"]] == ["text", "text_pair"]
        result = client.infer(path.name, inputs)
    finally:
        client.close()
    classify = pipeline("text-classification", model=str(path), tokenizer=str(path), top_k=None)
    labels = list(HEADS["single"][1])
    for row, (text, second) in enumerate(pairs):
        want = {item["label"]: item["score"] for item in classify({"text": text, "text_pair": second})}
        np.testing.assert_allclose(result.as_numpy("probabilities")[row], [want[label] for label in labels],
                                   rtol=0, atol=TOLERANCE)


def test_family_models_start_from_their_directory_only(directories: dict[tuple[str, str], Path]) -> None:
    """The served directory holds what save_pretrained wrote and nothing of glassbox's making."""
    for path in directories.values():
        assert {p.name for p in path.iterdir()} <= {"config.json", "model.safetensors", "tokenizer.json",
                                                   "tokenizer_config.json", "special_tokens_map.json"}


def test_a_classifier_saved_with_default_labels_is_served_as_the_pipeline_serves_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """transformers 5 leaves default labels out of config.json (a classifier made with num_labels and no names: a
    binary one has no num_labels either, test_config.py); its pipeline answers LABEL_0, LABEL_1, ..., and so does
    glassbox, saying so once."""
    import json

    from glassbox.service.model.inspection import inspect_directory

    path = save_family_model(tmp_path / "unnamed", "bert", "single", seed=5).path
    config = json.loads((path / "config.json").read_text())
    for key in ("id2label", "label2id", "problem_type"):
        config.pop(key, None)
    (path / "config.json").write_text(json.dumps({**config, "num_labels": 3}))  # the tiny head has 3 outputs
    report = inspect_directory(path)
    assert report.servable and report.labels == ["LABEL_0", "LABEL_1", "LABEL_2"] and not report.labels_named
    want = reference(path)
    with caplog.at_level("WARNING", logger="glassbox"), ready_client(create_app(settings_for(path))) as client:
        answer = client.post("/predict", json={"inputs": TEXTS[0]}).json()
    assert_ranked(answer, want[0])
    assert {a["label"] for a in answer} == {"LABEL_0", "LABEL_1", "LABEL_2"}
    assert [r.message for r in caplog.records if "has no id2label" in r.message] == [
        f"{path / 'config.json'} has no id2label: serving its 3 outputs as LABEL_0, LABEL_1, LABEL_2, transformers' "
        "default names (name them in config.json)"]
