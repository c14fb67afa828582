"""TEI's surface on the real app with tiny models: pairs on /predict, /rerank, POST / and /invocations, the health
probes, /info, /tokenize and /decode, and text pairs on /v1/classify (JSON and pair frames)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from glassbox.service.app import create_app
from glassbox.service.classification import probabilities
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.model.loader import load_model
from glassbox.service.wire import frames
from tests.helpers import make_tiny_model_dir
from tests.service.apptools import LABELS, FakeEngine, app_settings, ready_client, wait_ready

PAIRS = [("what is the plot?", "a boring story"), ("good film", "great acting and fun music")]


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-output BERT: what TEI calls a reranker (a cross-encoder)."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("reranker"), seed=3, id2label={"0": "LABEL_0"})


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path) -> Iterator[TestClient]:
    with ready_client(create_app(app_settings(tiny_model_dir))) as client:
        yield client


@pytest.fixture(scope="module")
def reranker(reranker_dir: Path) -> Iterator[TestClient]:
    with ready_client(create_app(app_settings(reranker_dir))) as client:
        yield client


def pair_logits(model_dir: Path, pairs: list[tuple[str, str]]) -> np.ndarray:
    """The model run directly, one pair at a time, outside the server."""
    loaded = load_model(model_dir)
    tokenizer = loaded.text_tokenizer(32)
    engine = EagerEngine(loaded.model, "cpu")
    return np.stack([engine.run(tokenizer.encode([a], [b])).logits[0] for a, b in pairs])  # [n, labels]


def ranked(probs: np.ndarray) -> list[tuple[str, float]]:
    order = np.argsort(-probs, kind="stable")
    return [(LABELS[j], float(probs[j])) for j in order]


def same(answer: list[dict[str, object]], want: list[tuple[str, float]]) -> bool:
    """The same labels in the same order, with scores within float32 noise."""
    return [p["label"] for p in answer] == [label for label, _ in want] and [p["score"] for p in answer] == (
        pytest.approx([score for _, score in want], abs=1e-6))


def test_predict_answers_a_pair_and_a_mixed_batch_as_tei(client: TestClient, tiny_model_dir: Path) -> None:
    probs = probabilities(pair_logits(tiny_model_dir, PAIRS))
    single = client.post("/predict", json={"inputs": list(PAIRS[0])})
    assert single.status_code == 200
    assert same(single.json(), ranked(probs[0]))
    batch = client.post("/predict", json={"inputs": [list(PAIRS[1]), ["good film"], list(PAIRS[0])]}).json()
    assert len(batch) == 3
    assert same(batch[0], ranked(probs[1])) and same(batch[2], ranked(probs[0]))
    alone = client.post("/predict", json={"inputs": "good film"}).json()
    assert same(batch[1], [(p["label"], p["score"]) for p in alone])
    paired = client.post("/predict", json={"inputs": ["good film", "boring"]}).json()
    assert not same(paired, [(p["label"], p["score"]) for p in alone])  # the second text changed the answer


def test_post_root_and_invocations_route_to_predict_for_a_classifier(client: TestClient) -> None:
    body = {"inputs": [["good film"], list(PAIRS[0])], "raw_scores": True}
    want = client.post("/predict", json=body).json()
    for path in ("/", "/invocations"):
        got = client.post(path, json=body).json()
        # The two texts may ride in one batch or in two (two engine threads): their padding, and so the last bits
        # of a score, can differ from one request to the next.
        assert [[s["label"] for s in row] for row in got] == [[s["label"] for s in row] for row in want]
        assert [[s["score"] for s in row] for row in got] == [
            pytest.approx([s["score"] for s in row], abs=1e-5) for row in want]


def test_rerank_on_a_classifier_is_refused_as_tei_does(client: TestClient) -> None:
    response = client.post("/rerank", json={"query": "q", "texts": ["a"]})
    assert response.status_code == 424 and response.json()["error"]["code"] == "not_a_reranker"


def test_rerank_scores_query_text_pairs_best_first(reranker: TestClient, reranker_dir: Path) -> None:
    texts = ["a boring story", "great acting and fun music", "the plot", "fun"]
    logits = pair_logits(reranker_dir, [("what is good?", t) for t in texts])[:, 0]  # [n]
    answer = reranker.post("/rerank", json={"query": "what is good?", "texts": texts, "return_text": True})
    assert answer.status_code == 200
    order = np.argsort(-logits, kind="stable").tolist()
    assert [r["index"] for r in answer.json()] == order
    assert [r["text"] for r in answer.json()] == [texts[i] for i in order]
    assert [r["score"] for r in answer.json()] == pytest.approx([float(1 / (1 + np.exp(-logits[i]))) for i in order],
                                                                abs=1e-6)
    raw = reranker.post("/rerank", json={"query": "what is good?", "texts": texts, "raw_scores": True}).json()
    assert [r["score"] for r in raw] == pytest.approx(sorted(logits.tolist(), reverse=True), abs=1e-5)
    assert all("text" not in r for r in raw)
    # A reranker's base URL and SageMaker route are /rerank, as in TEI.
    assert reranker.post("/", json={"query": "what is good?", "texts": texts}).json() == [
        {k: v for k, v in r.items() if k != "text"} for r in answer.json()]
    assert reranker.post("/invocations", json={"query": "q", "texts": []}).json()["error"]["code"] == "empty_input"
    assert reranker.get("/info").json()["model_type"] == {"reranker": {"id2label": {"0": "LABEL_0"},
                                                                       "label2id": {"LABEL_0": 0}}}


def test_health_probes_answer_empty_200_when_ready_and_503_while_loading(tiny_model_dir: Path) -> None:
    engine = FakeEngine(hold_warmup=True)
    app = create_app(app_settings(tiny_model_dir), engine=engine)
    with TestClient(app) as client:
        for path in ("/", "/health", "/ping"):
            loading = client.get(path)
            assert (loading.status_code, loading.json()["error"]["code"]) == (503, "not_ready")
        engine.release()
        wait_ready(client.get)
        for path in ("/", "/health", "/ping"):
            ready = client.get(path)
            assert (ready.status_code, ready.content) == (200, b"")


def test_info_describes_model_and_limits_in_tei_shape(client: TestClient, tiny_model_dir: Path) -> None:
    info = client.get("/info").json()
    assert info["model_id"] == tiny_model_dir.name and info["model_dtype"] == "float32"
    assert info["model_type"] == {"classifier": {"id2label": {"0": "negative", "1": "positive", "2": "neutral"},
                                                 "label2id": {"negative": 0, "positive": 1, "neutral": 2}}}
    assert (info["max_input_length"], info["max_client_batch_size"], info["max_batch_requests"]) == (32, 8, 32)
    assert info["auto_truncate"] is True and info["max_batch_tokens"] == 4096
    assert info["glassbox"] == {"problem_type": "single_label_classification", "family": "bert", "model_type": "bert",
                                "architecture": "BertForSequenceClassification", "pairs": True, "device": "cpu",
                                "engine": "eager-fp32"}


def test_tokenize_and_decode(client: TestClient) -> None:
    tokens = client.post("/tokenize", json={"inputs": "Good film"})
    assert tokens.status_code == 200 and tokens.headers["x-request-id"]
    (row,) = tokens.json()
    assert [(t["text"], t["special"], t["start"], t["stop"]) for t in row] == [
        ("[CLS]", True, None, None), ("Good", False, 0, 4), ("film", False, 5, 9), ("[SEP]", True, None, None)]
    ids = [t["id"] for t in row]
    assert client.post("/decode", json={"ids": ids[1:3]}).json() == ["good film"]
    assert client.post("/decode", json={"ids": [ids[1:2], ids[2:3]]}).json() == ["good", "film"]
    long = client.post("/tokenize", json={"inputs": ["good " * 50, "x"], "add_special_tokens": False}).json()
    assert len(long[0]) == 50 and len(long[1]) == 1  # not truncated at max_length 32
    refused = client.post("/decode", json={"ids": [10_000]})
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "invalid_request")
    empty = client.post("/tokenize", json={"inputs": []})
    assert (empty.status_code, empty.json()["error"]["code"]) == (422, "empty_input")


def test_tokenize_and_decode_take_as_many_tokens_as_the_largest_classify_request(client: TestClient) -> None:
    # 8 texts of at most 32 tokens here. Unbounded, a 4 MB body of one-letter words grew the server by 1.1 GB for a
    # 139 MB /tokenize answer, and a 4 MB body of ids held the event loop for 0.7 s in /decode.
    most = 8 * 32
    fits = client.post("/tokenize", json={"inputs": ["good " * 128] * 2, "add_special_tokens": False})
    assert fits.status_code == 200 and sum(map(len, fits.json())) == most
    over = client.post("/tokenize", json={"inputs": ["good " * 128, "good " * 129], "add_special_tokens": False})
    assert (over.status_code, over.json()["error"]["code"]) == (413, "text_too_long")
    assert str(most) in over.json()["error"]["message"]
    huge = client.post("/tokenize", json={"inputs": "." * 1_000_000})
    assert (huge.status_code, huge.json()["error"]["code"]) == (413, "text_too_long")
    good = fits.json()[0][0]["id"]
    assert client.post("/decode", json={"ids": [[good] * 128] * 2}).status_code == 200
    refused = client.post("/decode", json={"ids": [good] * (most + 1)})
    assert (refused.status_code, refused.json()["error"]["code"]) == (413, "text_too_long")


def test_v1_classify_takes_pairs_as_json_and_as_pair_frames(client: TestClient, tiny_model_dir: Path) -> None:
    probs = probabilities(pair_logits(tiny_model_dir, PAIRS))
    one = client.post("/v1/classify", json={"text": PAIRS[0][0], "text_pair": PAIRS[0][1], "all_scores": True})
    assert one.status_code == 200
    assert same(one.json()["results"][0]["scores"], ranked(probs[0]))
    many = client.post("/v1/classify", json={"texts": [a for a, _ in PAIRS], "text_pairs": [b for _, b in PAIRS]})
    assert [r["label"] for r in many.json()["results"]] == [LABELS[int(j)] for j in probs.argmax(1)]
    body = frames.encode_frames([a for a, _ in PAIRS], [11, 12], pairs=[b for _, b in PAIRS])
    framed = client.post("/v1/classify?top_k=1", content=body, headers={"content-type": frames.PAIR_CONTENT_TYPE})
    assert framed.status_code == 200
    results = framed.json()["results"]
    assert [results["11"]["scores"][0]["score"], results["12"]["scores"][0]["score"]] == pytest.approx(
        probs.max(1).tolist())


def test_tei_routes_read_a_gzip_body(client: TestClient) -> None:
    """A compressed body is inflated on every route that reads one, engine or not (service/http/encoding.py)."""
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    for path, body in [("/predict", {"inputs": "good"}), ("/tokenize", {"inputs": "good"}), ("/decode", {"ids": [1]})]:
        plain = client.post(path, json=body)
        coded = client.post(path, content=gzip.compress(json.dumps(body).encode()), headers=headers)
        assert (coded.status_code, coded.json()) == (200, plain.json())
