from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema_rs
import msgspec
import pytest
import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from schemathesis import Case

from glassbox.service.classification import ClassifyRequest
from glassbox.service.errors import GlassboxError, TooManyTextsError, status_for
from glassbox.service.http.context import error_body
from glassbox.service.wire import frames, json_api, kserve, openapi, rerank, tei, tei_tools
from glassbox.service.wire.schema import REF_TEMPLATE
from tests.service.wire.builders import LABELS, infer_rules_hold, pairs_match, result_for

MAX_TEXTS = 4
DOCUMENT = openapi.build_document("tiny", MAX_TEXTS)
OPERATIONS = schemathesis.openapi.from_dict(DOCUMENT)
ROUTES = {
    ("POST", "/v1/classify"),
    ("POST", "/predict"),
    ("GET", "/v2"),
    ("GET", "/v2/health/live"),
    ("GET", "/v2/health/ready"),
    ("GET", "/v2/models/{name}"),
    ("GET", "/v2/models/{name}/ready"),
    ("POST", "/v2/models/{name}/infer"),
    ("GET", "/v2/models/{name}/versions/{version}"),
    ("GET", "/v2/models/{name}/versions/{version}/ready"),
    ("POST", "/v2/models/{name}/versions/{version}/infer"),
    ("GET", "/livez"),
    ("GET", "/readyz"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("POST", "/rerank"),
    ("POST", "/"),
    ("GET", "/"),
    ("POST", "/invocations"),
    ("GET", "/health"),
    ("GET", "/ping"),
    ("GET", "/info"),
    ("POST", "/tokenize"),
    ("POST", "/decode"),
}


def validator(name: str) -> jsonschema_rs.Validator:
    root = {"$ref": f"#/components/schemas/{name}", "components": DOCUMENT["components"]}
    return jsonschema_rs.Draft202012Validator(root)


def assert_valid(name: str, instance: Any) -> None:
    errors = [str(e) for e in validator(name).iter_errors(instance)]
    assert not errors, errors


def test_every_route_is_documented_and_schemathesis_can_load_it() -> None:
    found = {(op.ok().method.upper(), op.ok().path) for op in OPERATIONS.get_all_operations()}
    assert found == ROUTES
    assert DOCUMENT["openapi"] == "3.1.0"


@pytest.mark.parametrize("name", sorted(DOCUMENT["components"]["schemas"]))
def test_every_component_is_a_valid_json_schema(name: str) -> None:
    validator(name)  # jsonschema_rs refuses invalid schemas and unresolvable $refs here


def test_limits_reach_the_schemas() -> None:
    texts = DOCUMENT["components"]["schemas"]["ClassifyRequest"]["oneOf"][1]["properties"]["texts"]
    assert (texts["minItems"], texts["maxItems"]) == (1, MAX_TEXTS)
    infer = DOCUMENT["paths"]["/v2/models/{name}/infer"]["post"]
    assert infer["parameters"][0]["schema"]["enum"] == ["tiny"]


def test_encoded_responses_match_their_schemas() -> None:
    result = result_for([[0.0, 2.0, 1.0], [3.0, -1.0, 0.5]], tokens=[4, 9], truncated=[False, True])
    for request in (ClassifyRequest(texts=("a", "b")), ClassifyRequest(texts=("a", "b"), top_k=2, all_scores=True)):
        assert_valid("ClassifyResponse", json.loads(json_api.encode(result, request, "tiny")))
    framed = ClassifyRequest(texts=("a", "b"), user_ids=(1, 2**64 - 1), all_scores=True)
    assert_valid("FramesResponse", json.loads(frames.encode_response(result, framed, "tiny")))
    assert_valid("PredictResponse", json.loads(tei.encode(result, ClassifyRequest(texts=("a", "b")))))
    one = result_for([[0.0, 2.0, 1.0]])
    assert_valid("PredictResponse", json.loads(tei.encode(one, ClassifyRequest(texts=("a",), single=True))))
    outputs = (
        kserve.OutputRequest("label", False),
        kserve.OutputRequest("probabilities", True, 2),
        kserve.OutputRequest("logits", False),
    )
    body, headers = kserve.encode_infer(result, ClassifyRequest(texts=("a", "b"), request_id="x"), outputs, "tiny")
    assert_valid("InferResponse", json.loads(body[: int(headers[kserve.HEADER_LENGTH])]))
    assert_valid("ModelMetadata", kserve.model_metadata("tiny", LABELS))
    assert_valid("ServerMetadata", kserve.server_metadata())


@pytest.mark.parametrize("struct", [json_api.ClassifyResponse, json_api.TextResult, json_api.LabelScore,
                                    frames.FramesResponse, tei.Prediction, kserve.InferResponse, kserve.OutputTensor,
                                    rerank.Rank, tei_tools.SimpleToken], ids=lambda struct: struct.__name__)
def test_response_components_are_the_encoders_structs(struct: type[msgspec.Struct]) -> None:
    """Derived, not restated: a field added to a struct is in the document without anyone writing it there."""
    schema = copy.deepcopy(DOCUMENT["components"]["schemas"][struct.__name__])
    assert schema["title"] == struct.__name__
    assert set(schema["properties"]) == set(struct.__struct_fields__)
    derived = msgspec.json.schema_components([struct], ref_template=REF_TEMPLATE)[1][struct.__name__]
    if struct is kserve.OutputTensor:  # its `name` is narrowed to the served head's outputs
        assert schema["properties"].pop("name") == {"enum": ["label", "probabilities", "logits"]}
        derived["properties"].pop("name")
    assert schema == derived


def test_error_bodies_match_the_error_schema() -> None:
    error = TooManyTextsError("5 texts in one request; the limit is 4")
    assert_valid("Error", error_body(error, "/v1/classify"))
    assert str(status_for(error)) in DOCUMENT["paths"]["/v1/classify"]["post"]["responses"]


def test_v2_error_bodies_are_the_protocols_and_documented_so() -> None:
    error = TooManyTextsError("5 texts in one request; the limit is 4")
    body = error_body(error, "/v2/models/tiny/versions/1/infer")
    assert body == {"error": error.message}
    assert_valid("KServeError", body)
    for path, spec in DOCUMENT["paths"].items():
        for operation in spec.values():
            refs = [response["content"]["application/json"]["schema"].get("$ref", "")
                    for status, response in operation["responses"].items() if status >= "400" and "content" in response]
            shapes = {ref.rsplit("/", 1)[1] for ref in refs if ref}  # /livez and /readyz: their own status body
            assert shapes <= ({"KServeError"} if path.startswith("/v2") else {"Error"}), (path, shapes)


def _decode_case(case: Case) -> ClassifyRequest:
    if case.operation.path == "/predict":
        return tei.decode(json.dumps(case.body).encode(), max_texts=MAX_TEXTS)
    if case.operation.path == "/v1/classify":
        return json_api.decode(json.dumps(case.body).encode(), max_texts=MAX_TEXTS)
    request, _ = kserve.decode_infer(json.dumps(case.body).encode(), None, max_texts=MAX_TEXTS)
    return request


SLOW = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


@SLOW
@given(OPERATIONS["/v1/classify"]["POST"].as_strategy())
def test_json_bodies_the_schema_allows_are_accepted(case: Case) -> None:
    assume(case.media_type == "application/json" and pairs_match(case.body))
    assert 1 <= len(_decode_case(case).texts) <= MAX_TEXTS


@SLOW
@given(OPERATIONS["/predict"]["POST"].as_strategy())
def test_tei_bodies_the_schema_allows_are_accepted(case: Case) -> None:
    assert 1 <= len(_decode_case(case).texts) <= MAX_TEXTS


@SLOW
@given(OPERATIONS["/v2/models/{name}/infer"]["POST"].as_strategy())
def test_infer_bodies_the_schema_allows_are_accepted_unless_a_stated_rule_is_broken(case: Case) -> None:
    stated_rules_hold = infer_rules_hold(case.body)
    try:
        request = _decode_case(case)
    except GlassboxError as error:
        assert not stated_rules_hold, f"{error.code}: {error.message}"
        assert 400 <= status_for(error) < 500
    else:
        assert stated_rules_hold and 1 <= len(request.texts) <= MAX_TEXTS
