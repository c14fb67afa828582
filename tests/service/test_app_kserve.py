"""KServe v2 / Open Inference Protocol, spoken by Triton's own `tritonclient.http.InferenceServerClient` to the real app
under uvicorn on 127.0.0.1, with the tiny model; answers compared with the model run directly and with /v1/classify.

The wire-level encoding (binary tensor extension, error cases) is tested in tests/service/wire/test_kserve.py; this
file is about the client and the server agreeing over a real socket.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from glassbox.service.app import create_app
from tests.service.apptools import BOUND_S, LABELS, LiveServer, Reference, app_settings, live_server, wait_ready

TEXTS = ["a very good movie", "the worst film and a boring plot", "great", "Café — très bien 🎬", "bad acting"]


@dataclass
class Served:
    live: LiveServer
    client: triton.InferenceServerClient
    name: str
    reference: Reference


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[Served]:
    settings = app_settings(tiny_model_dir, max_batch_size=2)
    with live_server(create_app(settings), settings) as live:
        wait_ready(lambda path: httpx.get(live.base_url + path, timeout=BOUND_S))
        client = triton.InferenceServerClient(f"127.0.0.1:{live.port}", connection_timeout=BOUND_S,
                                              network_timeout=BOUND_S)
        try:
            yield Served(live, client, tiny_model_dir.name, Reference(tiny_model_dir, 32))
        finally:
            client.close()


def text_input(texts: list[str], binary: bool) -> triton.InferInput:
    tensor = triton.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_), binary_data=binary)
    return tensor


def as_text(element: bytes | str) -> str:
    """tritonclient hands BYTES elements back as bytes from binary data and as str from JSON data."""
    return element.decode() if isinstance(element, bytes) else element


def test_health_and_readiness(served: Served) -> None:
    assert served.client.is_server_live()
    assert served.client.is_server_ready()
    assert served.client.is_model_ready(served.name)
    assert not served.client.is_model_ready("not-" + served.name)


def test_probes_answer_the_bodies_kserves_own_client_reads(served: Served) -> None:
    """kserve.InferenceRESTClient (KServe's Python SDK) takes `response.json().get("live")` / `.get("ready")` of a 200,
    as KServe's own server answers; an empty body makes it raise instead of answering. tritonclient reads the status
    alone, so both clients are served by one answer."""
    for path, body in [("/v2/health/live", {"live": True}), ("/v2/health/ready", {"ready": True}),
                       (f"/v2/models/{served.name}/ready", {"name": served.name, "ready": True}),
                       (f"/v2/models/{served.name}/versions/1/ready", {"name": served.name, "ready": True})]:
        response = httpx.get(served.live.base_url + path, timeout=BOUND_S)
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        assert response.json() == body


def test_server_and_model_metadata(served: Served) -> None:
    server = served.client.get_server_metadata()
    assert server["name"] == "glassbox"
    assert {"binary_tensor_data", "classification"} <= set(server["extensions"])
    model = served.client.get_model_metadata(served.name)
    assert model["name"] == served.name
    assert model["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]},
                               {"name": "text_pair", "datatype": "BYTES", "shape": [-1]}]
    assert {o["name"]: (o["datatype"], o["shape"]) for o in model["outputs"]} == {
        "label": ("BYTES", [-1]), "probabilities": ("FP32", [-1, 3]), "logits": ("FP32", [-1, 3]),
    }


def test_unknown_model_is_an_error_the_client_raises(served: Served) -> None:
    with pytest.raises(InferenceServerException) as metadata:
        served.client.get_model_metadata("no-such-model")
    assert metadata.value.status() == "404"
    with pytest.raises(InferenceServerException) as infer:
        served.client.infer("no-such-model", [text_input(["good"], True)])
    assert infer.value.status() == "404"
    assert "'no-such-model' is not served here" in str(infer.value)  # the protocol's body: {"error": "<message>"}


@pytest.mark.parametrize("binary_input", [True, False], ids=["binary-input", "json-input"])
@pytest.mark.parametrize("binary_output", [True, False], ids=["binary-output", "json-output"])
def test_infer_returns_labels_probabilities_and_logits_of_the_model(
    served: Served, binary_input: bool, binary_output: bool
) -> None:
    outputs = [triton.InferRequestedOutput(name, binary_data=binary_output)
               for name in ("label", "probabilities", "logits")]
    result = served.client.infer(served.name, [text_input(TEXTS, binary_input)], outputs=outputs,
                                 request_id="triton-1")
    logits, probs = served.reference.logits(TEXTS), served.reference.probs(TEXTS)
    got_labels = result.as_numpy("label")
    got_probs = result.as_numpy("probabilities")
    got_logits = result.as_numpy("logits")
    assert got_labels.shape == (len(TEXTS),)
    assert [as_text(label) for label in got_labels] == [LABELS[i] for i in probs.argmax(axis=1)]
    assert (got_probs.dtype, got_probs.shape) == (np.float32, (len(TEXTS), 3))
    np.testing.assert_allclose(got_probs, probs, atol=1e-5)
    np.testing.assert_allclose(got_logits, logits, atol=1e-4)
    response = result.get_response()
    assert (response["id"], response["model_name"]) == ("triton-1", served.name)
    for output in response["outputs"]:
        assert ("binary_data_size" in output.get("parameters", {})) == binary_output
        assert ("data" in output) != binary_output


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_a_compressed_request_is_answered_as_the_plain_one(served: Served, algorithm: str) -> None:
    """tritonclient's request_compression_algorithm compresses the whole body (JSON header and binary data) and says
    so in Content-Encoding; read as it came, it was refused with a 400 about Inference-Header-Content-Length."""
    plain = served.client.infer(served.name, [text_input(TEXTS, True)])
    compressed = served.client.infer(served.name, [text_input(TEXTS, True)], request_compression_algorithm=algorithm)
    assert compressed.as_numpy("label").tolist() == plain.as_numpy("label").tolist()
    # Within float noise: the two requests may ride in batches of different shapes.
    np.testing.assert_allclose(compressed.as_numpy("probabilities"), plain.as_numpy("probabilities"), atol=1e-5)


def test_default_outputs_are_all_three(served: Served) -> None:
    result = served.client.infer(served.name, [text_input(TEXTS[:2], True)])
    assert {o["name"] for o in result.get_response()["outputs"]} == {"label", "probabilities", "logits"}
    np.testing.assert_allclose(result.as_numpy("probabilities"), served.reference.probs(TEXTS[:2]), atol=1e-5)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("output", ["probabilities", "logits"])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_classification_extension_gives_the_k_best_as_score_index_label(
    served: Served, output: str, k: int, binary: bool
) -> None:
    requested = [triton.InferRequestedOutput(output, binary_data=binary, class_count=k)]
    result = served.client.infer(served.name, [text_input(TEXTS, True)], outputs=requested)
    classes = result.as_numpy(output)
    shown = min(k, len(LABELS))
    assert classes.shape == (len(TEXTS), shown)
    expected = served.reference.probs(TEXTS) if output == "probabilities" else served.reference.logits(TEXTS)
    for row, values in zip(classes, expected, strict=True):
        order = np.argsort(-values, kind="stable")[:shown]
        parsed = [as_text(entry).split(":") for entry in row]
        assert [int(index) for _, index, _ in parsed] == order.tolist()
        assert [label for _, _, label in parsed] == [LABELS[j] for j in order]
        assert [float(score) for score, _, _ in parsed] == pytest.approx(values[order].tolist(), abs=1e-4)


def test_infer_agrees_with_the_json_route(served: Served) -> None:
    result = served.client.infer(
        served.name, [text_input(TEXTS, False)],
        outputs=[triton.InferRequestedOutput("label", binary_data=False),
                 triton.InferRequestedOutput("probabilities", binary_data=True)],
    )
    answer = httpx.post(served.live.base_url + "/v1/classify", json={"texts": TEXTS, "all_scores": True},
                        timeout=BOUND_S)
    assert answer.status_code == 200
    results = answer.json()["results"]
    assert [as_text(label) for label in result.as_numpy("label")] == [r["label"] for r in results]
    by_label = [{s["label"]: s["score"] for s in r["scores"]} for r in results]
    np.testing.assert_allclose(result.as_numpy("probabilities"),
                               [[row[label] for label in LABELS] for row in by_label], atol=1e-6)


def test_infer_responses_carry_the_timing_headers(served: Served) -> None:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["good"]}]}
    response = httpx.post(f"{served.live.base_url}/v2/models/{served.name}/infer", json=body, timeout=BOUND_S)
    assert response.status_code == 200
    assert float(response.headers["x-latency-ms"]) > 0
    assert [part.split(";")[0].strip() for part in response.headers["server-timing"].split(",")] == [
        "parse", "tokenize", "queue", "infer", "postprocess"]
