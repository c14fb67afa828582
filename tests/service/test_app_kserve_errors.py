"""Every error path of the /v2 routes, through Triton's own `tritonclient.http` client against the real app under
uvicorn: the client must raise an `InferenceServerException` whose status and message a user can read (the
protocol's error body is `{"error": "<message>"}`; glassbox's own `{"error": {"code", "message"}}` made the client's
`str()` itself raise). Also the versioned routes (`/versions/{v}`, `.../ready`, `.../infer`) the client calls when
given a model version, and the limits the protocol layer enforces (413 for a body over --max-body-bytes)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from glassbox.service.app import create_app
from tests.service.apptools import BOUND_S, LiveServer, app_settings, live_server, wait_ready

MAX_BODY = 2048
KEY = "k-0123456789"


@pytest.fixture(scope="module")
def live(tiny_model_dir: Path) -> Iterator[LiveServer]:
    settings = app_settings(tiny_model_dir, max_texts_per_request=4, max_body_bytes=MAX_BODY)
    with live_server(create_app(settings), settings) as server:
        wait_ready(lambda path: httpx.get(server.base_url + path, timeout=BOUND_S))
        yield server


@pytest.fixture(scope="module")
def client(live: LiveServer) -> Iterator[triton.InferenceServerClient]:
    triton_client = triton.InferenceServerClient(f"127.0.0.1:{live.port}", connection_timeout=BOUND_S,
                                                 network_timeout=BOUND_S)
    yield triton_client
    triton_client.close()


@pytest.fixture(scope="module")
def name(tiny_model_dir: Path) -> str:
    return tiny_model_dir.name


def texts(values: list[str], name: str = "text", datatype: str = "BYTES") -> triton.InferInput:
    tensor = triton.InferInput(name, [len(values)], datatype)
    if datatype == "BYTES":
        tensor.set_data_from_numpy(np.array([v.encode() for v in values], dtype=np.object_))
    else:
        tensor.set_data_from_numpy(np.arange(len(values), dtype=np.int32))
    return tensor


def refusal(call: object, *args: object, **kwargs: object) -> InferenceServerException:
    """The exception `call(*args, **kwargs)` raises; its str() must work and carry the message (a str)."""
    assert callable(call)
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    error = caught.value
    assert isinstance(error.message(), str), error.message()
    assert error.message() in str(error)  # str() raised TypeError when the body was glassbox's own shape
    return error


def test_unknown_model_metadata_and_infer_name_the_served_model(client: triton.InferenceServerClient,
                                                                 name: str) -> None:
    for error in (refusal(client.get_model_metadata, "nope"), refusal(client.infer, "nope", [texts(["good"])])):
        assert error.status() == "404"
        assert error.message() == f"model 'nope' is not served here; this server serves {name!r}"
    assert not client.is_model_ready("nope")


def test_versioned_routes_serve_the_one_version(client: triton.InferenceServerClient, name: str) -> None:
    assert client.get_model_metadata(name, model_version="1")["versions"] == ["1"]
    assert client.is_model_ready(name, model_version="1")
    versioned = client.infer(name, [texts(["good", "bad"])], model_version="1")
    plain = client.infer(name, [texts(["good", "bad"])])
    np.testing.assert_array_equal(versioned.as_numpy("logits"), plain.as_numpy("logits"))
    assert versioned.get_response()["model_version"] == "1"


def test_an_unknown_version_is_a_404_that_names_the_version(client: triton.InferenceServerClient,
                                                              name: str) -> None:
    expected = f"model {name!r} has no version '2'; its one version is '1'"
    for error in (refusal(client.get_model_metadata, name, model_version="2"),
                  refusal(client.infer, name, [texts(["good"])], model_version="2")):
        assert (error.status(), error.message()) == ("404", expected)
    assert not client.is_model_ready(name, model_version="2")


def test_the_model_configuration_extension_is_absent_and_says_so(client: triton.InferenceServerClient,
                                                                   name: str) -> None:
    error = refusal(client.get_model_config, name)
    assert error.status() == "404"
    assert error.message() == f"no route for GET /v2/models/{name}/config"


@pytest.mark.parametrize(("tensor", "status", "message"), [
    (lambda: texts(["good"], name="txt"), "400", "unknown input 'txt'; the inputs are 'text' and, for text pairs, "
                                                 "'text_pair'"),
    (lambda: texts(["good"], datatype="INT32"), "400", "input 'text' must have datatype BYTES, not 'INT32'"),
    (lambda: texts(["a", "b", "c", "d", "e"]), "413", "5 texts in one request; the limit is 4 "
                                                      "(--max-texts-per-request)"),
    (lambda: texts([""]), "422", "the text is empty: there is nothing to classify (send at least one character)"),
], ids=["input-name", "datatype", "too-many", "empty-text"])
def test_bad_inputs_are_4xx_with_the_reason(client: triton.InferenceServerClient, name: str, tensor: object,
                                           status: str, message: str) -> None:
    assert callable(tensor)
    error = refusal(client.infer, name, [tensor()])
    assert (error.status(), error.message()) == (status, message)


def test_an_unknown_output_is_named(client: triton.InferenceServerClient, name: str) -> None:
    error = refusal(client.infer, name, [texts(["good"])], outputs=[triton.InferRequestedOutput("embedding")])
    assert (error.status(), error.message()) == (
        "400", "output 'embedding' does not exist; outputs are label, probabilities, logits")


def test_a_body_over_the_cap_is_413_with_the_limit_in_the_protocols_shape(client: triton.InferenceServerClient,
                                                                           name: str) -> None:
    error = refusal(client.infer, name, [texts(["x" * (MAX_BODY + 10)])])
    assert (error.status(), error.message()) == (
        "413", f"the request body is larger than the limit of {MAX_BODY} bytes (--max-body-bytes)")


def test_a_compressed_body_is_held_to_the_cap_once_inflated(live: LiveServer, name: str) -> None:
    header = json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                                     "data": ["x" * (MAX_BODY * 4)]}]}).encode()
    bomb = httpx.post(f"{live.base_url}/v2/models/{name}/infer", content=gzip.compress(header),
                      headers={"Content-Encoding": "gzip"}, timeout=BOUND_S)
    assert (bomb.status_code, bomb.json()) == (
        413, {"error": f"the body inflates to more than {MAX_BODY} bytes (--max-body-bytes)"})
    other = httpx.post(f"{live.base_url}/v2/models/{name}/infer", content=header[:100],
                       headers={"Content-Encoding": "br"}, timeout=BOUND_S)
    assert other.status_code == 415 and "'br' is not supported" in other.json()["error"]


def test_glassbox_routes_keep_glassbox_error_body(live: LiveServer) -> None:
    response = httpx.post(f"{live.base_url}/v1/classify", json={"texts": ["a"] * 5}, timeout=BOUND_S)
    assert response.status_code == 413
    assert response.json() == {"error": {"code": "too_many_texts", "message": "5 texts in one request; the limit "
                                                                              "is 4 (--max-texts-per-request)"}}
    on_v2 = httpx.get(f"{live.base_url}/v2/nothing-here", timeout=BOUND_S)
    assert (on_v2.status_code, on_v2.json()) == (404, {"error": "no route for GET /v2/nothing-here"})


def test_without_the_api_key_the_client_reads_a_401(tiny_model_dir: Path) -> None:
    settings = app_settings(tiny_model_dir, api_key=KEY)
    with live_server(create_app(settings), settings) as server:
        wait_ready(lambda path: httpx.get(server.base_url + path, timeout=BOUND_S))
        keyless = triton.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=BOUND_S)
        try:
            error = refusal(keyless.infer, tiny_model_dir.name, [texts(["good"])])
            assert (error.status(), error.message()) == (
                "401", "this route needs the API key: send 'Authorization: Bearer <key>'")
            assert keyless.is_model_ready(tiny_model_dir.name, model_version="1")  # a probe: open by default
            answer = keyless.infer(tiny_model_dir.name, [texts(["good"])], headers={"Authorization": f"Bearer {KEY}"})
            assert answer.as_numpy("label").shape == (1,)
        finally:
            keyless.close()
