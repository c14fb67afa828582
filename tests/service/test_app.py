"""The HTTP app end to end through Starlette's TestClient: the real tiny model behind every route, answers checked
against the same model run directly (tests/service/apptools.Reference), errors, headers, the observer, readiness.

Concurrency (429, deadlines, disconnects) needs a real server and lives in test_pipeline.py; KServe with the real
tritonclient in test_app_kserve.py; the schemathesis run in test_app_schemathesis.py.
"""

from __future__ import annotations

import contextlib
import json
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from glassbox.service.app import create_app
from glassbox.service.observer import STAGES
from glassbox.service.settings import Settings
from tests.service.apptools import (
    BOUND_S,
    LABELS,
    FakeEngine,
    RecordingObserver,
    Reference,
    app_settings,
    parse_server_timing,
    ready_client,
    wait_ready,
    wait_until,
)

FRAMES = "application/x-glassbox-frames"
TEXTS = [
    "a very good movie",
    "the worst film and a boring plot with a slow and sad ending",
    "great",
    "fun music and a short script",
    "bad acting",
    "the plot was long but the ending was funny",
]
LONG = " ".join(["good"] * 60)  # 62 tokens with [CLS] and [SEP]: over the test max_length of 32
MAX_TEXTS = 8


@dataclass
class Served:
    client: TestClient
    observer: RecordingObserver
    settings: Settings
    name: str


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> Reference:
    return Reference(tiny_model_dir, 32)


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[Served]:
    observer = RecordingObserver()
    # Batches of at most 3 rows, so a request of six texts is split across batches and must be reassembled.
    settings = app_settings(tiny_model_dir, max_batch_size=3, max_texts_per_request=MAX_TEXTS)
    with ready_client(create_app(settings, observer=observer)) as client:
        yield Served(client, observer, settings, tiny_model_dir.name)


def frame(text: bytes, user_id: int) -> bytes:
    """One frame, spelled out from the documented layout rather than with the module under test."""
    return struct.pack("<I", len(text)) + text + struct.pack("<Q", user_id)


def ranked_labels(probs: np.ndarray, k: int) -> list[tuple[str, float]]:
    order = sorted(range(len(LABELS)), key=lambda j: -float(probs[j]))[:k]
    return [(LABELS[j], float(probs[j])) for j in order]


def assert_result_matches(result: dict[str, Any], probs: np.ndarray, tokens: int, scores: int = 0) -> None:
    best = int(np.argmax(probs))
    assert result["label"] == LABELS[best]
    assert result["score"] == pytest.approx(float(probs[best]), abs=1e-5)
    assert result["tokens"] == tokens
    if scores == 0:
        assert "scores" not in result
        return
    expected = ranked_labels(probs, scores)
    assert [s["label"] for s in result["scores"]] == [label for label, _ in expected]
    assert [s["score"] for s in result["scores"]] == pytest.approx([p for _, p in expected], abs=1e-5)


# --- POST /v1/classify, JSON -----------------------------------------------------------------------------------------
def test_one_text_gets_the_models_best_label(served: Served, reference: Reference) -> None:
    response = served.client.post("/v1/classify", json={"text": TEXTS[0]})
    assert response.status_code == 200
    body = response.json()
    assert body["model"] == served.name
    assert len(body["results"]) == 1
    assert body["results"][0]["truncated"] is False
    assert_result_matches(body["results"][0], reference.probs(TEXTS[:1])[0], reference.lengths(TEXTS[:1])[0])


def test_a_batch_is_answered_in_input_order(served: Served, reference: Reference) -> None:
    # Lengths 6, 18, 3, 8, 4, 15 tokens: three length buckets, so the batcher reorders rows; answers must not.
    response = served.client.post("/v1/classify", json={"texts": TEXTS})
    assert response.status_code == 200
    results = response.json()["results"]
    probs, lengths = reference.probs(TEXTS), reference.lengths(TEXTS)
    assert [r["tokens"] for r in results] == lengths
    assert len(set(lengths)) == len(TEXTS)  # distinct lengths, so the token counts alone pin the order
    for result, row, tokens in zip(results, probs, lengths, strict=True):
        assert_result_matches(result, row, tokens)


@pytest.mark.parametrize(
    ("body", "query", "listed"),
    [
        ({"top_k": 2}, {}, 2),
        ({"all_scores": True}, {}, 3),
        ({"top_k": 10}, {}, 3),  # clamped to the label count
        ({}, {"top_k": "1"}, 1),
        ({}, {"all_scores": "true"}, 3),
        ({"top_k": 3}, {"top_k": "1"}, 3),  # the body's own field wins over the query default
        ({"all_scores": False}, {"all_scores": "true"}, 0),
        ({"top_k": 1, "all_scores": True}, {}, 1),  # top_k wins over all_scores
    ],
)
def test_top_k_and_all_scores_from_body_or_query(
    served: Served, reference: Reference, body: dict[str, Any], query: dict[str, str], listed: int
) -> None:
    texts = TEXTS[:3]
    response = served.client.post("/v1/classify", json={"texts": texts, **body}, params=query)
    assert response.status_code == 200, response.text
    probs, lengths = reference.probs(texts), reference.lengths(texts)
    for result, row, tokens in zip(response.json()["results"], probs, lengths, strict=True):
        assert_result_matches(result, row, tokens, scores=listed)


def test_a_long_text_is_truncated_by_default(served: Served, reference: Reference) -> None:
    response = served.client.post("/v1/classify", json={"texts": [LONG, "good"]})
    assert response.status_code == 200
    long_result, short_result = response.json()["results"]
    assert (long_result["tokens"], long_result["truncated"]) == (32, True)
    assert (short_result["tokens"], short_result["truncated"]) == (3, False)
    assert_result_matches(long_result, reference.probs([LONG])[0], 32)


# --- POST /v1/classify, binary frames --------------------------------------------------------------------------------
def test_frames_are_keyed_by_user_id_and_equal_the_json_answers(served: Served, reference: Reference) -> None:
    texts = TEXTS[:4]
    user_ids = [7, 0, 2**64 - 1, 42]
    body = b"".join(frame(t.encode(), u) for t, u in zip(texts, user_ids, strict=True))
    framed = served.client.post("/v1/classify", content=body, headers={"Content-Type": FRAMES},
                                params={"all_scores": "true"})
    as_json = served.client.post("/v1/classify", json={"texts": texts, "all_scores": True})
    assert framed.status_code == as_json.status_code == 200
    assert framed.headers["content-type"] == "application/json"
    keyed = framed.json()["results"]
    assert framed.json()["model"] == served.name
    assert set(keyed) == {str(u) for u in user_ids}
    for user_id, json_result, row, tokens in zip(user_ids, as_json.json()["results"], reference.probs(texts),
                                                 reference.lengths(texts), strict=True):
        result = keyed[str(user_id)]
        assert_result_matches(result, row, tokens, scores=3)
        assert {k: v for k, v in result.items() if k != "scores"} == pytest.approx(
            {k: v for k, v in json_result.items() if k != "scores"}, abs=1e-6)
        assert [s["label"] for s in result["scores"]] == [s["label"] for s in json_result["scores"]]


def test_frames_with_multibyte_text_and_a_content_type_parameter(served: Served, reference: Reference) -> None:
    text = "Café, très bien! 🎬"
    response = served.client.post("/v1/classify", content=frame(text.encode(), 5),
                                  headers={"Content-Type": FRAMES + "; charset=binary"}, params={"top_k": "2"})
    assert response.status_code == 200, response.text
    assert_result_matches(response.json()["results"]["5"], reference.probs([text])[0], reference.lengths([text])[0],
                          scores=2)


# --- POST /predict (TEI) ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("inputs", [TEXTS[0], [TEXTS[0]]])
def test_predict_one_input_lists_every_label_best_first(served: Served, reference: Reference, inputs: Any) -> None:
    response = served.client.post("/predict", json={"inputs": inputs})
    assert response.status_code == 200
    predictions = response.json()
    assert all(set(p) == {"score", "label"} for p in predictions)
    expected = ranked_labels(reference.probs(TEXTS[:1])[0], 3)
    assert [p["label"] for p in predictions] == [label for label, _ in expected]
    assert [p["score"] for p in predictions] == pytest.approx([p for _, p in expected], abs=1e-5)


@pytest.mark.parametrize("raw_scores", [False, True])
def test_predict_batch_is_a_list_per_input(served: Served, reference: Reference, raw_scores: bool) -> None:
    texts = [TEXTS[2], TEXTS[1], TEXTS[4]]
    response = served.client.post("/predict", json={"inputs": [[t] for t in texts], "raw_scores": raw_scores})
    assert response.status_code == 200
    rows = response.json()
    assert len(rows) == len(texts)
    expected_scores = reference.logits(texts) if raw_scores else reference.probs(texts)
    for predictions, expected in zip(rows, expected_scores, strict=True):
        assert len(predictions) == len(LABELS)
        scores = [p["score"] for p in predictions]
        assert scores == sorted(scores, reverse=True)
        by_label = {p["label"]: p["score"] for p in predictions}
        assert by_label == pytest.approx(dict(zip(LABELS, expected.tolist(), strict=True)), abs=1e-4)
    if raw_scores:  # logits, not probabilities: some fall outside [0, 1] or the row does not sum to 1
        assert any(abs(sum(p["score"] for p in predictions) - 1) > 1e-3 for predictions in rows)


def test_predict_truncate_false_refuses_an_over_long_text(served: Served) -> None:
    refused = served.client.post("/predict", json={"inputs": [["good"], [LONG]], "truncate": False})
    assert refused.status_code == 413
    assert refused.json()["error"]["code"] == "text_too_long"
    assert "text 1" in refused.json()["error"]["message"]
    assert served.client.post("/predict", json={"inputs": LONG}).status_code == 200  # the server truncates
    assert served.client.post("/predict", json={"inputs": LONG, "truncate": True}).status_code == 200


def test_oversize_reject_setting_refuses_long_texts_before_the_engine(tiny_model_dir: Path) -> None:
    settings = app_settings(tiny_model_dir, oversize="reject")
    app = create_app(settings)
    with ready_client(app) as client:
        runs_before = app.state.batcher.stats().items_run
        for path, body in (("/v1/classify", {"texts": ["good", LONG]}), ("/predict", {"inputs": LONG})):
            response = client.post(path, json=body)
            assert response.status_code == 413
            assert response.json()["error"]["code"] == "text_too_long"
        assert app.state.batcher.stats().items_run == runs_before  # refused before anything was queued
        overridden = client.post("/predict", json={"inputs": LONG, "truncate": True})
        assert overridden.status_code == 200  # TEI's per-request truncate wins over the server setting
        short = client.post("/v1/classify", json={"text": "good"})
        assert short.status_code == 200 and short.json()["results"][0]["truncated"] is False
        assert app.state.batcher.stats().items_run == runs_before + 2


# --- errors ----------------------------------------------------------------------------------------------------------
JSON = "application/json"
INFER_BODY = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["good"]}]}).encode()
ERRORS = [
    # (id, method, path, content type, body, extra headers, status, code)
    ("invalid json", "POST", "/v1/classify", JSON, b'{"texts": ["a"', {}, 400, "invalid_json"),
    ("not utf-8 json", "POST", "/v1/classify", JSON, b'{"text": "\xff"}', {}, 400, "invalid_json"),
    ("text not a string", "POST", "/v1/classify", JSON, b'{"text": 5}', {}, 400, "invalid_request"),
    ("texts not a list", "POST", "/v1/classify", JSON, b'{"texts": "abc"}', {}, 400, "invalid_request"),
    ("a number in texts", "POST", "/v1/classify", JSON, b'{"texts": ["a", 1]}', {}, 400, "invalid_request"),
    ("both text and texts", "POST", "/v1/classify", JSON, b'{"text": "a", "texts": ["b"]}', {}, 400,
     "invalid_request"),
    ("misspelt option", "POST", "/v1/classify", JSON, b'{"text": "a", "topk": 2}', {}, 400, "invalid_request"),
    ("top_k zero", "POST", "/v1/classify", JSON, b'{"text": "a", "top_k": 0}', {}, 400, "invalid_request"),
    ("top_k query garbage", "POST", "/v1/classify?top_k=two", JSON, b'{"text": "a"}', {}, 400, "invalid_request"),
    ("empty list", "POST", "/v1/classify", JSON, b'{"texts": []}', {}, 422, "empty_input"),
    ("an empty text", "POST", "/v1/classify", JSON, b'{"text": ""}', {}, 422, "empty_input"),
    ("an empty text among others", "POST", "/v1/classify", JSON, b'{"texts": ["a", ""]}', {}, 422, "empty_input"),
    ("an empty frame", "POST", "/v1/classify", FRAMES, frame(b"ok", 1) + frame(b"", 2), {}, 422, "empty_input"),
    ("predict an empty text", "POST", "/predict", JSON, b'{"inputs": ""}', {}, 422, "empty_input"),
    ("infer an empty text", "POST", "/v2/models/{name}/infer", JSON, INFER_BODY.replace(b'["good"]', b'[""]'), {},
     422, "empty_input"),
    ("too many texts", "POST", "/v1/classify", JSON, json.dumps({"texts": ["a"] * (MAX_TEXTS + 1)}).encode(), {},
     413, "too_many_texts"),
    ("frames invalid utf-8", "POST", "/v1/classify", FRAMES, frame(b"ok", 1) + frame(b"\xc3(", 2), {}, 400,
     "invalid_utf8"),
    ("frame length beyond the body", "POST", "/v1/classify", FRAMES, struct.pack("<I", 100) + b"abc" + bytes(8), {},
     400, "frame_truncated"),
    ("frames trailing bytes", "POST", "/v1/classify", FRAMES, frame(b"ok", 1) + b"\x01\x02", {}, 400,
     "frame_trailing_bytes"),
    ("frames duplicate user id", "POST", "/v1/classify", FRAMES, frame(b"a", 3) + frame(b"b", 3), {}, 400,
     "duplicate_user_id"),
    ("frames empty body", "POST", "/v1/classify", FRAMES, b"", {}, 422, "empty_input"),
    ("too many frames", "POST", "/v1/classify", FRAMES, b"".join(frame(b"a", i) for i in range(MAX_TEXTS + 1)), {},
     413, "too_many_texts"),
    ("unknown content type", "POST", "/v1/classify", "text/plain", b"good movie", {}, 415, "unsupported_media_type"),
    ("unknown route", "POST", "/v1/classify/extra", JSON, b'{"text": "a"}', {}, 404, "not_found"),
    ("unknown route get", "GET", "/metrics-nope", None, b"", {}, 404, "not_found"),
    ("wrong method", "GET", "/v1/classify", None, b"", {}, 405, "method_not_allowed"),
    ("wrong method predict", "PUT", "/predict", JSON, b'{"inputs": "a"}', {}, 405, "method_not_allowed"),
    ("timeout not a number", "POST", "/v1/classify", JSON, b'{"text": "a"}', {"X-Request-Timeout-Ms": "soon"}, 400,
     "invalid_request"),
    ("timeout zero", "POST", "/v1/classify", JSON, b'{"text": "a"}', {"X-Request-Timeout-Ms": "0"}, 400,
     "invalid_request"),
    ("timeout negative", "POST", "/predict", JSON, b'{"inputs": "a"}', {"X-Request-Timeout-Ms": "-5"}, 400,
     "invalid_request"),
    ("timeout nan", "POST", "/v1/classify", JSON, b'{"text": "a"}', {"X-Request-Timeout-Ms": "nan"}, 400,
     "invalid_request"),
    ("predict empty", "POST", "/predict", JSON, b'{"inputs": []}', {}, 422, "empty_input"),
    ("predict left truncation", "POST", "/predict", JSON, b'{"inputs": "a", "truncation_direction": "Left"}', {},
     400, "truncation_direction_unsupported"),
    ("predict inputs a number", "POST", "/predict", JSON, b'{"inputs": 3}', {}, 400, "invalid_request"),
    ("infer unknown model", "POST", "/v2/models/nope/infer", JSON, INFER_BODY, {}, 404, "not_found"),
    ("infer wrong datatype", "POST", "/v2/models/{name}/infer", JSON, INFER_BODY.replace(b"BYTES", b"FP32"), {}, 400,
     "invalid_tensor"),
    ("infer unknown output", "POST", "/v2/models/{name}/infer", JSON,
     INFER_BODY[:-1] + b', "outputs": [{"name": "embedding"}]}', {}, 400, "unknown_output"),
    ("model metadata unknown model", "GET", "/v2/models/nope", None, b"", {}, 404, "not_found"),
]


def test_an_empty_text_is_named_by_its_place(served: Served) -> None:
    refused = served.client.post("/v1/classify", json={"texts": ["a", "b", ""]})
    assert refused.status_code == 422
    assert refused.json()["error"]["message"].startswith("text 2 is empty: there is nothing to classify")
    alone = served.client.post("/v1/classify", json={"text": ""})
    assert alone.json()["error"]["message"].startswith("the text is empty")
    assert served.client.post("/v1/classify", json={"text": " "}).status_code == 200  # spaces are a text, as in TEI


@pytest.mark.parametrize(("method", "path", "media", "body", "headers", "status", "code"),
                         [case[1:] for case in ERRORS], ids=[case[0] for case in ERRORS])
def test_bad_requests_get_a_4xx_with_a_stable_code(
    served: Served, method: str, path: str, media: str | None, body: bytes, headers: dict[str, str], status: int,
    code: str,
) -> None:
    sent = dict(headers)
    if media is not None:
        sent["Content-Type"] = media
    response = served.client.request(method, path.format(name=served.name), content=body or None, headers=sent)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()
    if path.startswith("/v2/"):  # the Open Inference Protocol's body, {"error": "<message>"}; the code is observed
        assert set(error) == {"error"} and isinstance(error["error"], str) and error["error"]
        observed = [r for r in served.observer.requests if r.request_id == response.headers["x-request-id"]]
        assert [r.error_code for r in observed] == ([code] if method == "POST" else [])
    else:
        assert set(error) == {"error"} and set(error["error"]) == {"code", "message"}
        assert error["error"]["code"] == code
        assert isinstance(error["error"]["message"], str) and error["error"]["message"]
    assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"])
    if status == 405:
        assert method not in response.headers["allow"] and "POST" in response.headers["allow"]


def test_a_405_names_every_method_the_path_takes(served: Served) -> None:
    """`/` is TEI's info (GET) and predict (POST) routes, `/v1/classify` one route: RFC 9110's Allow lists all."""
    for path, allowed in [("/", {"GET", "HEAD", "POST"}), ("/v1/classify", {"POST"})]:
        response = served.client.put(path, content=b"{}")
        assert response.status_code == 405
        assert set(response.headers["allow"].split(", ")) == allowed, path


@pytest.mark.parametrize("path", ["/v1/classify/", "/predict/", "/v2/health/ready/", "/metrics/"])
def test_a_trailing_slash_is_a_404_not_a_redirect_to_the_route(served: Served, path: str) -> None:
    # A 307 would be answered before any access check and would make a redirect-following client resend its body
    # to a route it did not name.
    response = served.client.post(path, json={"inputs": "good"}, follow_redirects=False)
    assert response.status_code == 404, response.headers
    assert "location" not in response.headers
    error = response.json()["error"]
    assert isinstance(error, str) if path.startswith("/v2/") else error["code"] == "not_found"  # KServe's own body


def test_a_made_up_long_path_or_model_name_is_not_echoed_whole(served: Served) -> None:
    for path in ("/" + "x" * 5000, "/v2/models/" + "m" * 5000):
        response = served.client.get(path)
        assert response.status_code == 404
        assert len(response.text) < 600, path  # the error body names the path, cut short


# --- headers ---------------------------------------------------------------------------------------------------------
ROUTE_BODIES = [
    ("/v1/classify", JSON, json.dumps({"texts": TEXTS}).encode()),
    ("/v1/classify", FRAMES, frame(b"good", 1) + frame(b"a boring plot", 2)),
    ("/predict", JSON, json.dumps({"inputs": [[t] for t in TEXTS[:3]]}).encode()),
    ("/v2/models/{name}/infer", JSON, INFER_BODY),
]


@pytest.mark.parametrize(("path", "media", "body"), ROUTE_BODIES, ids=["json", "frames", "predict", "infer"])
def test_latency_and_server_timing_headers(served: Served, path: str, media: str, body: bytes) -> None:
    response = served.client.post(path.format(name=served.name), content=body, headers={"Content-Type": media})
    assert response.status_code == 200, response.text
    latency_ms = float(response.headers["x-latency-ms"])
    assert latency_ms > 0
    timing = parse_server_timing(response.headers["server-timing"])
    assert [name for name, _ in timing] == list(STAGES)
    assert all(duration >= 0 for _, duration in timing)
    assert timing[3][1] > 0  # the engine ran a real forward pass
    # The stages are disjoint slices of the request's time; each value is rounded to 0.001 ms.
    assert sum(duration for _, duration in timing) <= latency_ms + 0.01


def test_request_id_is_echoed_or_generated(served: Served) -> None:
    echoed = served.client.post("/v1/classify", json={"text": "good"}, headers={"X-Request-Id": "req-42"})
    assert echoed.headers["x-request-id"] == "req-42"
    failed = served.client.post("/v1/classify", json={"texts": []}, headers={"X-Request-Id": "req-43"})
    assert failed.headers["x-request-id"] == "req-43"
    generated = [served.client.post("/v1/classify", json={"text": "good"}).headers["x-request-id"] for _ in range(2)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in generated)
    assert generated[0] != generated[1]
    too_long = served.client.post("/v1/classify", json={"text": "good"}, headers={"X-Request-Id": "x" * 200})
    assert re.fullmatch(r"[0-9a-f]{32}", too_long.headers["x-request-id"])
    utf8 = served.client.post("/v1/classify", json={"text": "good"}, headers={"X-Request-Id": "café".encode()})
    assert re.fullmatch(r"[0-9a-f]{32}", utf8.headers["x-request-id"])  # replaced, not echoed as Latin-1 mojibake


# --- the observer ----------------------------------------------------------------------------------------------------
def test_the_observer_gets_one_record_per_request(served: Served, reference: Reference) -> None:
    served.observer.requests.clear()
    client, name = served.client, served.name
    texts = TEXTS[:3]
    sent = [
        client.post("/v1/classify", json={"texts": texts}, headers={"X-Request-Id": "obs-json"}),
        client.post("/v1/classify", content=frame(b"good", 1) + frame(b"bad", 2), headers={"Content-Type": FRAMES}),
        client.post("/predict", json={"inputs": LONG}),
        client.post(f"/v2/models/{name}/infer", content=INFER_BODY, headers={"Content-Type": JSON}),
        client.post("/v1/classify", content=b"{", headers={"Content-Type": JSON}),
        client.post("/v1/classify", content=b"good", headers={"Content-Type": "text/plain"}),
        client.post("/v2/models/nope/infer", content=INFER_BODY, headers={"Content-Type": JSON}),
    ]
    records = served.observer.requests
    assert len(records) == len(sent)
    expected = [  # route, status, error code, texts
        ("/v1/classify", 200, None, texts),
        ("/v1/classify", 200, None, ["good", "bad"]),
        ("/predict", 200, None, [LONG]),
        ("/v2/models/{name}/infer", 200, None, ["good"]),
        ("/v1/classify", 400, "invalid_json", []),
        ("/v1/classify", 415, "unsupported_media_type", []),
        ("/v2/models/{name}/infer", 404, "not_found", []),
    ]
    for record, response, (route, status, code, done) in zip(records, sent, expected, strict=True):
        assert (record.route, record.method, record.status, record.error_code) == (route, "POST", status, code)
        assert response.status_code == status
        assert record.request_id == response.headers["x-request-id"]
        assert record.start_ns < record.end_ns
        assert float(response.headers["x-latency-ms"]) == pytest.approx(record.duration_s * 1000, abs=0.002)
        if not done:
            assert (record.texts, record.tokens, record.batch_ids, record.device) == (0, 0, (), "")
            assert len(record.stages) < len(STAGES)
            continue
        lengths = reference.lengths(done)
        assert [s.name for s in record.stages] == list(STAGES)
        assert record.start_ns <= record.stages[0].start_ns and record.stages[-1].end_ns <= record.end_ns
        for earlier, later in zip(record.stages, record.stages[1:], strict=False):
            assert earlier.start_ns <= earlier.end_ns <= later.start_ns
        assert (record.texts, record.tokens, record.max_tokens) == (len(done), sum(lengths), max(lengths))
        assert record.truncated == (1 if done == [LONG] else 0)
        assert (record.device, record.engine_mode) == ("cpu", "eager")
        assert record.batch_ids and all(b > 0 for b in record.batch_ids)
    assert records[0].request_id == "obs-json"


class FailingObserver(RecordingObserver):
    def on_request(self, record: Any) -> None:
        raise RuntimeError("telemetry backend is down")


def test_an_observer_that_raises_does_not_fail_the_request(tiny_model_dir: Path) -> None:
    with ready_client(create_app(app_settings(tiny_model_dir), observer=FailingObserver())) as client:
        response = client.post("/v1/classify", json={"text": "good"})
    assert response.status_code == 200
    assert response.json()["results"][0]["tokens"] == 3


class BlockObserver(RecordingObserver):
    """Notes, for each request record, whether its turn's block (glassbox.service.observer.TurnBuffered) was open."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.open = False
        self.inside: list[bool] = []
        self.fail = fail

    def on_request(self, record: Any) -> None:
        super().on_request(record)
        self.inside.append(self.open)

    @contextlib.contextmanager
    def buffered(self) -> Iterator[None]:
        self.open = True
        try:
            yield
        finally:
            self.open = False
            if self.fail:
                raise OSError("the log's disk is full")


@pytest.mark.parametrize("fail", [False, True])
def test_requests_are_observed_inside_their_turns_block(tiny_model_dir: Path, fail: bool) -> None:
    observer = BlockObserver(fail)
    with ready_client(create_app(app_settings(tiny_model_dir), observer=observer)) as client:
        answers = [client.post("/v1/classify", json={"text": "good"}) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200]  # a block that fails as it ends fails no request
    assert observer.inside == [True, True] and not observer.open


# --- health and readiness --------------------------------------------------------------------------------------------
def test_not_ready_until_warm_up_completes_then_ready(tiny_model_dir: Path, reference: Reference) -> None:
    engine = FakeEngine(hold_warmup=True)
    name = tiny_model_dir.name
    app = create_app(app_settings(tiny_model_dir), engine=engine)
    try:
        with TestClient(app) as client:
            loading = client.get("/readyz")
            assert loading.status_code == 503
            assert loading.json()["status"] == "loading"
            assert client.get("/livez").json()["status"] == "live"
            # The /v2 probes' bodies say it too: KServe's client reads them (tests/service/test_app_kserve.py).
            assert [(r.status_code, r.json()) for r in map(client.get, ("/v2/health/live", "/v2/health/ready",
                                                                        f"/v2/models/{name}/ready"))] == [
                (200, {"live": True}), (503, {"ready": False}), (503, {"name": name, "ready": False})]
            refused = client.post("/v1/classify", json={"text": "good"})
            assert (refused.status_code, refused.json()["error"]["code"]) == (503, "not_ready")
            assert engine.rows == []

            engine.release()
            wait_ready(client.get)
            assert client.get("/readyz").json() == {"status": "ready", "device": "cpu", "reason": ""}
            assert [client.get(p).status_code for p in ("/v2/health/ready", f"/v2/models/{name}/ready")] == [200, 200]
            served = client.post("/v1/classify", json={"texts": ["good", "a bad movie"], "all_scores": True})
            assert served.status_code == 200
            tokens = reference.tokens(["good", "a bad movie"])
            for result, ids, length in zip(served.json()["results"], tokens.ids, tokens.lengths, strict=True):
                logits = np.array(FakeEngine.logits_of([int(v) for v in ids[:length]]), dtype=np.float32)
                probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
                assert_result_matches(result, probs, int(length), scores=3)
    finally:
        engine.release()
    assert app.state.lifecycle.readiness().phase == "stopped"


def test_a_failed_warm_up_turns_liveness_false(tiny_model_dir: Path) -> None:
    engine = FakeEngine(fail_warmup="the device fell off the bus")
    with TestClient(create_app(app_settings(tiny_model_dir), engine=engine)) as client:
        wait_until(lambda: client.get("/livez").status_code == 503, "liveness turned false", BOUND_S)
        live = client.get("/livez").json()
        assert live["status"] == "dead" and "the device fell off the bus" in live["reason"]
        assert client.get("/readyz").status_code == 503
        dead = client.get("/v2/health/live")
        assert (dead.status_code, dead.json()) == (503, {"live": False})
        assert client.post("/v1/classify", json={"text": "good"}).status_code == 503
    assert engine.rows == []


def test_draining_is_not_ready_but_still_serves_what_reaches_it(tiny_model_dir: Path) -> None:
    app = create_app(app_settings(tiny_model_dir))
    with ready_client(app) as client:
        app.state.lifecycle.begin_drain()  # what SIGTERM does first (tests/service/test_server.py drives the signal)
        readyz = client.get("/readyz")
        assert (readyz.status_code, readyz.json()["status"]) == (503, "draining")
        assert client.get("/v2/health/ready").status_code == 503
        assert client.get("/livez").status_code == 200
        # Balancers stop sending on /readyz; a request that still arrives is served, not failed.
        assert client.post("/v1/classify", json={"text": "good"}).status_code == 200


@pytest.mark.parametrize(("setting", "status"), [("200", 200), ("503", 503)])
def test_degraded_readiness_follows_the_setting(tiny_model_dir: Path, setting: str, status: int) -> None:
    app = create_app(app_settings(tiny_model_dir, ready_when_degraded=setting))
    with ready_client(app) as client:
        app.state.lifecycle.set_degraded("cpu", "fell back to the CPU after CUDA ran out of memory")
        readyz = client.get("/readyz")
        assert readyz.status_code == status
        assert readyz.json() == {"status": "degraded", "device": "cpu",
                                 "reason": "fell back to the CPU after CUDA ran out of memory"}
        app.state.lifecycle.clear_degraded("cpu")
        assert client.get("/readyz").json()["status"] == "ready"


def test_server_and_model_metadata(served: Served) -> None:
    server = served.client.get("/v2").json()
    assert server["name"] == "glassbox" and {"binary_tensor_data", "classification"} <= set(server["extensions"])
    model = served.client.get(f"/v2/models/{served.name}").json()
    assert model["name"] == served.name
    assert model["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]},
                               {"name": "text_pair", "datatype": "BYTES", "shape": [-1]}]
    assert [(o["name"], o["shape"]) for o in model["outputs"]] == [("label", [-1]), ("probabilities", [-1, 3]),
                                                                   ("logits", [-1, 3])]


@pytest.mark.parametrize("record_text", [False, True])
def test_raw_text_reaches_observers_only_when_the_operator_opts_in(tiny_model_dir: Path, record_text: bool) -> None:
    observer = RecordingObserver()
    settings = app_settings(tiny_model_dir, record_text=record_text)
    with ready_client(create_app(settings, observer=observer)) as client:
        response = client.post("/v1/classify", json={"texts": ["good movie", "bad plot"]})
    assert response.status_code == 200
    (record,) = [r for r in observer.requests if r.route == "/v1/classify"]
    assert record.attributes == ({"text": "good movie\nbad plot"} if record_text else {})
