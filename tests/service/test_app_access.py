"""The API key and CORS on the real app, and the real `huggingface_hub.InferenceClient` against glassbox's base URL
(a live uvicorn server on 127.0.0.1), with and without the key, as `tritonclient` runs in test_app_kserve.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError
from starlette.testclient import TestClient

from glassbox.service.app import create_app
from glassbox.service.errors import ConfigurationError
from glassbox.service.model.loader import load_model
from glassbox.telemetry import build_telemetry
from tests.service.apptools import (
    BOUND_S,
    LABELS,
    RecordingObserver,
    Reference,
    app_settings,
    live_server,
    ready_client,
    wait_ready,
)

KEY = "glassbox-test-key-0123456789"


@pytest.fixture(scope="module")
def guarded(tiny_model_dir: Path) -> Iterator[TestClient]:
    settings = app_settings(tiny_model_dir, api_key=KEY, cors_allow_origin="https://app.example")
    with TestClient(create_app(settings, telemetry=build_telemetry(settings))) as client:
        wait_ready(client.get)  # /readyz is a probe: open without the key
        yield client


def test_inference_routes_need_the_key_and_probes_do_not(guarded: TestClient, tiny_model_dir: Path) -> None:
    name = tiny_model_dir.name
    calls = [("POST", "/v1/classify", {"text": "good"}), ("POST", "/predict", {"inputs": "good"}),
             ("POST", "/", {"inputs": "good"}), ("POST", "/invocations", {"inputs": "good"}),
             ("POST", "/tokenize", {"inputs": "good"}), ("POST", "/decode", {"ids": [1]}),
             ("GET", "/info", None), ("GET", f"/v2/models/{name}", None),
             ("GET", f"/v2/models/{name}/versions/1", None)]
    for method, path, body in calls:
        refused = guarded.request(method, path, json=body)
        assert refused.status_code == 401, path
        assert refused.headers["www-authenticate"] == "Bearer"
        assert refused.headers["x-request-id"] and float(refused.headers["x-latency-ms"]) >= 0, path
        message = "this route needs the API key: send 'Authorization: Bearer <key>'"
        if path.startswith("/v2/"):  # the Open Inference Protocol's error body
            assert refused.json() == {"error": message}
        else:
            assert refused.json() == {"error": {"code": "unauthorized", "message": message}}
        wrong = guarded.request(method, path, json=body, headers={"Authorization": "Bearer not-" + KEY})
        assert wrong.status_code == 401, path
        allowed = guarded.request(method, path, json=body, headers={"Authorization": f"Bearer {KEY}"})
        assert allowed.status_code == 200, (path, allowed.text)
    for path in ("/livez", "/readyz", "/health", "/ping", "/", "/v2/health/live", "/v2/health/ready",
                 f"/v2/models/{name}/ready", f"/v2/models/{name}/versions/1/ready", "/metrics",
                 "/docs", "/openapi.json"):  # the API's description too: a browser cannot send the key
        assert guarded.get(path).status_code == 200, path


def test_refusals_are_observed_as_401s_and_never_reach_the_engine(tiny_model_dir: Path) -> None:
    observer = RecordingObserver()
    with ready_client(create_app(app_settings(tiny_model_dir, api_key=KEY), observer=observer)) as client:
        client.post("/v1/classify", json={"text": "good"})
        client.post("/v1/classify", json={"text": "good"}, headers={"Authorization": f"Bearer {KEY}"})
    codes = [(r.route, r.status, r.error_code) for r in observer.requests if r.route == "/v1/classify"]
    assert codes == [("/v1/classify", 401, "unauthorized"), ("/v1/classify", 200, None)]
    assert len(observer.batches) == 1  # only the request with the key ran


def test_cors_on_the_real_app(guarded: TestClient) -> None:
    preflight = guarded.options("/v1/classify", headers={"Origin": "https://app.example",
                                                          "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == "https://app.example"
    answer = guarded.post("/v1/classify", json={"text": "good"}, headers={
        "Origin": "https://app.example", "Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "https://app.example"
    assert "x-latency-ms" in answer.headers["access-control-expose-headers"]


def test_scope_all_closes_the_probes_and_metrics_too(tiny_model_dir: Path) -> None:
    settings = app_settings(tiny_model_dir, api_key=KEY, api_key_scope="all")
    with TestClient(create_app(settings, telemetry=build_telemetry(settings))) as client:
        wait_ready(lambda path: client.get(path, headers={"Authorization": f"Bearer {KEY}"}))
        for path in ("/readyz", "/health", "/metrics", "/v2/health/ready", "/docs", "/openapi.json"):
            assert client.get(path).status_code == 401, path
            assert client.get(path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200, path


def test_a_bad_key_file_stops_the_app_before_the_model_loads(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("")
    with pytest.raises(ConfigurationError, match="is empty"):
        create_app(app_settings(tmp_path / "no-model-here", api_key_file=str(tmp_path / "key")))


@pytest.mark.parametrize("key", [None, KEY], ids=["open", "with-key"])
def test_huggingface_hub_inference_client_against_the_base_url(tiny_model_dir: Path, key: str | None) -> None:
    """InferenceClient(model=base URL).text_classification posts TEI's body to POST /, exactly as against TEI."""
    settings = app_settings(tiny_model_dir, api_key=key or "")
    with live_server(create_app(settings), settings) as live:
        wait_ready(lambda path: httpx.get(live.base_url + path, timeout=BOUND_S))
        reference = Reference(tiny_model_dir, 32)
        probs = reference.probs(["a very good movie"])[0]
        client = InferenceClient(model=live.base_url, token=key, timeout=BOUND_S)
        answer = client.text_classification("a very good movie")
        # huggingface_hub returns the first element of the list TEI answers for one text: the best label.
        best = int(probs.argmax())
        assert (answer.label, answer.score) == (LABELS[best], pytest.approx(float(probs[best]), abs=1e-6))
        if key is not None:
            with pytest.raises(HfHubHTTPError) as refused:
                InferenceClient(model=live.base_url, timeout=BOUND_S).text_classification("a very good movie")
            assert refused.value.response.status_code == 401
            wrong = InferenceClient(model=live.base_url, token="hf_wrong", timeout=BOUND_S)
            with pytest.raises(HfHubHTTPError):
                wrong.text_classification("a very good movie")
        assert load_model(tiny_model_dir).labels == LABELS


def test_a_refused_scrape_is_counted_under_its_own_route_not_as_unmatched(tiny_model_dir: Path) -> None:
    # "unmatched" is for requests no route took (404, 405); /metrics is a route, refused for want of the key.
    settings = app_settings(tiny_model_dir, api_key=KEY, api_key_scope="all")
    with TestClient(create_app(settings, telemetry=build_telemetry(settings))) as client:
        wait_ready(lambda path: client.get(path, headers={"Authorization": f"Bearer {KEY}"}))
        assert client.get("/metrics").status_code == 401
        scrape = client.get("/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert 'glassbox_requests_total{code="unauthorized",route="/metrics",status="401"} 1.0' in scrape
    assert 'route="unmatched"' not in "\n".join(line for line in scrape.splitlines()
                                               if line.startswith("glassbox_requests_total"))
