"""schemathesis against the live app: the document it serves at /openapi.json, loaded over HTTP from a real uvicorn
server on 127.0.0.1 (the tiny model behind it), drives schema-valid and schema-violating requests at every operation.

Every response must pass `not_a_server_error` (zero 5xx), and the conformance checks that hold for this API:
status codes, content types, headers and bodies as documented, invalid data rejected, valid data accepted. Two
adjustments, stated in the OpenAPI document itself:
- a body with more texts than the limit is refused with 413 (`too_many_texts`), which schemathesis does not list
  among its default "rejected" statuses, so 413 is added to them; so is 424, what /rerank answers every body, valid
  or not, on a model that is not a reranker (the tiny model has three outputs);
- JSON Schema cannot say that a KServe input's `data` holds as many strings as its `shape` multiplies to, nor that
  an output is named once (the document says so in descriptions); `positive_data_acceptance` is applied to infer
  bodies only when those two rules hold, and to TEI bodies only without `truncate: false` (a text longer than the
  model's limit is then refused with 413, as TEI does; a schema cannot count tokens).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import Case, GenerationMode
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config._checks import NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES
from schemathesis.transport.asgi import ASGI_TRANSPORT
from schemathesis.transport.requests import REQUESTS_TRANSPORT
from schemathesis.transport.wsgi import WSGI_TRANSPORT

from glassbox.service.app import create_app
from glassbox.service.errors import GlassboxError
from glassbox.service.wire import frames, openapi
from tests.service.apptools import BOUND_S, LiveServer, app_settings, live_server, wait_ready
from tests.service.wire.builders import infer_rules_hold, pairs_match

MAX_TEXTS = 4
EXAMPLES = 50  # per operation and generation mode; the whole file stays well under a minute on two cores
INFER = "/v2/models/{name}/infer"
INFER_VERSIONED = "/v2/models/{name}/versions/{version}/infer"
FRAMES = frames.CONTENT_TYPE
PAIR_FRAMES = frames.PAIR_CONTENT_TYPE
ALWAYS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
)
CONFIG = schemathesis.Config.from_dict({
    "checks": {"negative_data_rejection": {"expected-statuses": [*NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES, "413",
                                                                          "424"]}},
    "generation": {"max-examples": EXAMPLES},
})
SEEN: Counter[tuple[str, str, int]] = Counter()  # (operation, media type, status) of every call made


@pytest.fixture(scope="module")
def live(tiny_model_dir: Path) -> Iterator[LiveServer]:
    settings_ = app_settings(tiny_model_dir, max_texts_per_request=MAX_TEXTS)
    with live_server(create_app(settings_), settings_) as server:
        wait_ready(lambda path: httpx.get(server.base_url + path, timeout=BOUND_S))
        yield server


@pytest.fixture(scope="module")
def api_schema(live: LiveServer) -> Any:
    # Fetched from the live app. from_dict rather than from_url: from_url leaves out the operation that serves the
    # document itself, and /openapi.json is one of the operations under test.
    document = httpx.get(live.base_url + "/openapi.json", timeout=BOUND_S).json()
    return schemathesis.openapi.from_dict(document, config=CONFIG)


@pytest.fixture(scope="module")
def frames_serializer() -> Iterator[None]:
    """Lets schemathesis send frames bodies (as raw bytes, like application/octet-stream) while this module runs."""
    schemathesis.serializer.alias([FRAMES, PAIR_FRAMES], "application/octet-stream")
    yield
    for transport in (ASGI_TRANSPORT, REQUESTS_TRANSPORT, WSGI_TRANSPORT):
        transport.unregister_serializer(FRAMES, PAIR_FRAMES)


def well_formed_frames(body: Any, pairs: bool) -> bool:
    """The frames rule the document states in prose: the body is whole frames with distinct user ids, and no empty
    text (a frame of length 0 has nothing to classify)."""
    try:
        request = frames.decode(body if isinstance(body, bytes) else str(body).encode(), max_texts=MAX_TEXTS,
                                pairs=pairs)
    except GlassboxError:
        return False
    return "" not in request.texts and "" not in (request.pairs or ())


def checks_for(case: Case[Any]) -> list[Any]:
    load_all_checks()
    names = list(ALWAYS)
    path = case.operation.path
    if case.media_type in (FRAMES, PAIR_FRAMES):
        holds = well_formed_frames(case.body, case.media_type == PAIR_FRAMES)
    elif path in (INFER, INFER_VERSIONED):
        holds = infer_rules_hold(case.body)
    elif path == "/v1/classify":
        holds = pairs_match(case.body)
    elif isinstance(case.body, dict) and case.body.get("truncate") is False:
        # TEI's `truncate: false` refuses a text longer than the model's limit with 413 (`text_too_long`, as TEI
        # does); JSON Schema cannot count tokens, so a valid-looking body may still be too long.
        holds = False
    else:
        # The tiny model has three outputs: /rerank answers every valid body 424 not_a_reranker, as documented.
        holds = path != "/rerank"
    if holds:
        names.append("positive_data_acceptance")
    return [CHECKS.get_one(name) for name in names]


def operations(document: dict[str, Any]) -> list[tuple[str, str | None, bool]]:
    """(label, request media type or None, whether it takes any input) for every operation and body media type."""
    found: list[tuple[str, str | None, bool]] = []
    for path, methods in document["paths"].items():
        for method, spec in methods.items():
            label = f"{method.upper()} {path}"
            media_types = list(spec.get("requestBody", {}).get("content", {})) or [None]
            found.extend((label, media, bool(spec.get("parameters") or media)) for media in media_types)
    return found


def meet_the_deadline(case: Case[Any]) -> None:
    """A valid X-Request-Timeout-Ms the generator drew (as little as a microsecond) becomes one the tiny model can
    meet: a shorter deadline is rightly answered 504 deadline_exceeded, at once when the request's own run cannot fit
    in it, and a positive case expects a 2xx. Invalid values are left alone: they must get 400."""
    headers = case.headers or {}
    try:
        valid = 0 < float(headers.get("X-Request-Timeout-Ms", "nan")) <= 3_600_000
    except ValueError:
        valid = False
    if valid:
        headers["X-Request-Timeout-Ms"] = "60000"


# The same function the app serves the document from; which operations exist does not depend on its arguments.
CASES = [
    pytest.param(label, media, mode, id=f"{label}-{media or 'no body'}-{mode.value}")
    for label, media, takes_input in operations(openapi.build_document("any", 1))
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if takes_input or mode is GenerationMode.POSITIVE  # nothing to get wrong in a request without inputs
]


@pytest.mark.parametrize(("label", "media", "mode"), CASES)
@pytest.mark.usefixtures("frames_serializer")
def test_every_operation_answers_as_documented_and_never_5xx(
    api_schema: Any, live: LiveServer, label: str, media: str | None, mode: GenerationMode
) -> None:
    operation = next(op.ok() for op in api_schema.get_all_operations() if op.ok().label == label)

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    # as_strategy draws the media type itself; keep the draws of the one this test case is about.
    @given(operation.as_strategy(generation_mode=mode).filter(lambda case: case.media_type == media))
    def run(case: Case[Any]) -> None:
        meet_the_deadline(case)
        response = case.call(base_url=live.base_url, timeout=BOUND_S)
        SEEN[(label, case.media_type or "", response.status_code)] += 1
        assert response.status_code < 500, response.text  # checked below too; this names the body at once
        case.validate_response(response, checks=checks_for(case))

    run()


def test_the_run_reached_the_model_and_every_media_type() -> None:
    """Guards the run above against testing nothing: each classify route got real answers and real refusals."""
    statuses: dict[tuple[str, str], set[int]] = {}
    for operation, media, status in SEEN:
        statuses.setdefault((operation, media), set()).add(status)
    if {(p.values[0], p.values[1] or "") for p in CASES} - set(statuses):
        pytest.skip("checks the whole schemathesis run above, which did not run in full in this session")
    for operation in ("POST /v1/classify", "POST /predict", "POST " + INFER, "POST " + INFER_VERSIONED):
        seen = statuses[(operation, "application/json")]
        assert 200 in seen and any(400 <= s < 500 for s in seen), (operation, seen)
    assert any(400 <= s < 500 for s in statuses[("POST /v1/classify", FRAMES)])
    assert all(status < 500 for _, _, status in SEEN)


def test_the_served_document_follows_the_live_settings(live: LiveServer, api_schema: Any) -> None:
    api_schema.validate()  # against the OpenAPI 3.1 meta-schema; raises on the first violation
    document = httpx.get(live.base_url + "/openapi.json", timeout=BOUND_S).json()
    assert document["openapi"] == "3.1.0"
    name = live.app.state.runtime.model_name
    assert document["paths"][INFER]["post"]["parameters"][0]["schema"]["enum"] == [name]
    texts = document["components"]["schemas"]["ClassifyRequest"]["oneOf"][1]["properties"]["texts"]
    assert texts["maxItems"] == MAX_TEXTS
    labels = {op.ok().label for op in api_schema.get_all_operations()}
    assert labels == {label for label, _, _ in operations(document)}  # the same operations CASES was built from
    assert {"POST /v1/classify", "POST /predict", "POST " + INFER, "GET /readyz", "GET /openapi.json"} <= labels
