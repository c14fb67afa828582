"""The OpenAPI 3.1 document the app serves at /openapi.json, built as a plain dict.

Response bodies are described by the msgspec structs their encoders write (`msgspec.json.schema_components`), so a
field added to a struct shows up here by itself. Request bodies are still written out below: each decoder's struct is
looser than the contract (one struct for both `text` and `texts`, exactly one of which must be sent) and the rules
it checks after decoding (limits from the served model and settings) are stated here as JSON Schema.

The schemas say what the decoders accept, as tightly as JSON Schema can: request bodies that fit them are
answered 200 and bodies that do not are answered 4xx. Three rules cannot be written in JSON Schema and are
stated in descriptions instead: a KServe input's `data` must hold exactly as many strings as its `shape`
multiplies to; a KServe output may be named only once; a frames body must be well-formed frames.
"""

from __future__ import annotations

from typing import Any

from glassbox.service.types import ProblemType
from glassbox.service.wire import frames, json_api, kserve, tei
from glassbox.service.wire.common import TOP_K_MAX
from glassbox.service.wire.frames import CONTENT_TYPE as FRAMES
from glassbox.service.wire.frames import PAIR_CONTENT_TYPE as PAIR_FRAMES
from glassbox.service.wire.kserve import HEADER_LENGTH, INPUT_NAME, MODEL_VERSION, PAIR_INPUT_NAME, output_names
from glassbox.service.wire.openapi_tei import tei_paths, tei_schemas
from glassbox.service.wire.schema import (
    CLASSIFY_ERRORS,
    REQUEST_HEADERS,
    TEXT,
    Schema,
    errors,
    json_content,
    obj,
    ref,
    struct_schemas,
    text_list,
    timing_headers,
)

OPENAPI_VERSION = "3.1.0"
KSERVE_ERROR = "KServeError"  # the /v2 routes' error body, as the Open Inference Protocol defines it

def _schemas(max_texts: int, problem: ProblemType) -> dict[str, Schema]:
    outputs = output_names(problem)  # the first one (label, or a regression model's score) takes no classification
    top_k: Schema = {"type": ["integer", "null"], "minimum": 1, "maximum": TOP_K_MAX}
    threshold: Schema = {"type": ["number", "null"], "minimum": 0, "maximum": 1}
    options: Schema = {"top_k": top_k, "all_scores": {"type": "boolean"}, "threshold": threshold}
    second_texts: Schema = {"type": "array", "items": {"type": ["string", "null"], "minLength": 1}, "minItems": 1,
                            "maxItems": max_texts, "description": "one second text (or null) per text"}
    one_input = text_list(1, 2)
    tensor_meta = obj(
        {
            "name": {"type": "string"},
            "datatype": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}},
        },
        ("name", "datatype", "shape"),
    )
    no_shared_memory: Schema = {
        key: False for key in ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
    }
    output_parameters = {"binary_data": {"type": "boolean"}, **no_shared_memory}
    # Responses: derived from the structs the encoders write (one statement of each shape); the served head's output
    # names are the one thing a struct cannot know.
    responses = struct_schemas(json_api.ClassifyResponse, frames.FramesResponse, tei.Prediction, kserve.InferResponse)
    responses["OutputTensor"]["properties"]["name"] = {"enum": list(outputs)}
    return {
        **responses,
        "Error": obj(
            {"error": obj({"code": {"type": "string"}, "message": {"type": "string"}}, ("code", "message"), True)},
            ("error",),
            True,
        ),
        "KServeError": obj({"error": {"type": "string"}}, ("error",)),
        "ClassifyRequest": {
            "description": 'Exactly one of "text" (with an optional "text_pair") or "texts" (with optional '
            '"text_pairs", as many entries as texts); unknown fields are refused. A regression model refuses '
            "top_k, all_scores and threshold.",
            "oneOf": [
                obj({"text": TEXT, "text_pair": TEXT, **options}, ("text",)),
                obj({"texts": text_list(1, max_texts), "text_pairs": second_texts, **options}, ("texts",)),
            ],
        },
        "PredictRequest": obj(
            {
                "inputs": {
                    "description": "One input (a string, a one-string list, or a pair of two strings) or a batch "
                    "of one- and two-string lists.",
                    "oneOf": [
                        TEXT,
                        one_input,
                        {"type": "array", "items": one_input, "minItems": 1, "maxItems": max_texts},
                    ],
                },
                "truncate": {"type": ["boolean", "null"]},
                "truncation_direction": {"enum": ["Right", "right"]},
                "raw_scores": {"type": "boolean"},
            },
            ("inputs",),
            True,
        ),
        "PredictResponse": {
            "oneOf": [
                {"type": "array", "items": ref("Prediction"), "minItems": 1},
                {"type": "array", "items": {"type": "array", "items": ref("Prediction")}, "minItems": 1},
            ]
        },
        "ServerMetadata": obj(
            {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "extensions": {"type": "array", "items": {"type": "string"}},
            },
            ("name", "version", "extensions"),
            True,
        ),
        "TensorMetadata": tensor_meta,
        "ModelMetadata": obj(
            {
                "name": {"type": "string"},
                "versions": {"type": "array", "items": {"type": "string"}},
                "platform": {"type": "string"},
                "inputs": {"type": "array", "items": ref("TensorMetadata")},
                "outputs": {"type": "array", "items": ref("TensorMetadata")},
            },
            ("name", "platform", "inputs", "outputs"),
            True,
        ),
        "InferRequest": obj(
            {
                "id": {"type": "string"},
                "parameters": obj({"binary_data_output": {"type": "boolean"}}, (), True),
                "inputs": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 2,
                    "description": f"{INPUT_NAME!r}, and for text pairs {PAIR_INPUT_NAME!r} holding as many "
                    "strings (element i is the second text of element i); each name once",
                    "items": obj(
                        {
                            "name": {"enum": [INPUT_NAME, PAIR_INPUT_NAME]},
                            "datatype": {"const": "BYTES"},
                            "shape": {
                                "type": "array",
                                "items": {"type": "integer", "minimum": 1, "maximum": max_texts},
                            },
                            "data": {
                                "type": "array",
                                "minItems": 1,
                                "maxItems": max_texts,
                                "items": TEXT,
                                "description": "as many strings as `shape` multiplies to",
                            },
                            "parameters": obj({"binary_data_size": False, **no_shared_memory}, (), True),
                        },
                        ("name", "datatype", "shape", "data"),
                        True,
                    ),
                },
                "outputs": {
                    "type": "array",
                    "maxItems": len(outputs),
                    "description": "each output at most once; none listed means all of them",
                    "items": {
                        "anyOf": [
                            obj(
                                {"name": {"const": outputs[0]}, "parameters": obj(output_parameters, (), True)},
                                ("name",),
                                True,
                            ),
                            obj(
                                {
                                    "name": {"enum": list(outputs[1:])},
                                    "parameters": obj(
                                        {**output_parameters, "classification": {"type": "integer", "minimum": 0}},
                                        (),
                                        True,
                                    ),
                                },
                                ("name",),
                                True,
                            ),
                        ]
                    },
                },
            },
            ("inputs",),
            True,
        ),
    }


def _health(description: str) -> Schema:
    status = obj({"status": {"type": "string"}}, ("status",), True)
    return {
        "200": {"description": description, "content": json_content(status)},
        "503": {"description": "not " + description, "content": json_content(status)},
    }


def _paths(model_name: str) -> dict[str, Schema]:
    name_param = {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "enum": [model_name]}}
    version_param = {"name": "version", "in": "path", "required": True,
                     "schema": {"type": "string", "enum": [MODEL_VERSION]}}
    query_options = [
        {"name": "top_k", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": TOP_K_MAX}},
        {"name": "all_scores", "in": "query", "schema": {"type": "boolean"}},
        {"name": "threshold", "in": "query", "schema": {"type": "number", "minimum": 0, "maximum": 1}},
    ]
    # A Media Type Object has no description field (OpenAPI 3.1 refuses unknown ones), so the schema carries it.
    frames_body = {
        "schema": {
            "type": "string",
            "format": "binary",
            "description": "frames of u32 LE text length | UTF-8 text | u64 LE user id, back to back; user ids unique",
        },
    }
    pair_frames_body = {
        "schema": {
            "type": "string",
            "format": "binary",
            "description": "frames of u32 LE length | UTF-8 text | u32 LE length | UTF-8 second text | u64 LE user id, "
            "back to back; user ids unique",
        },
    }
    return {
        "/v1/classify": {
            "post": {
                "operationId": "classify",
                "summary": "Classify texts or text pairs (JSON, binary frames or pair frames, by Content-Type)",
                "description": "top_k, all_scores and threshold in the query string apply to frames bodies and are "
                "defaults that a JSON body's own fields override.",
                "parameters": [*query_options, *REQUEST_HEADERS],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": ref("ClassifyRequest")}, FRAMES: frames_body,
                                PAIR_FRAMES: pair_frames_body},
                },
                "responses": {
                    "200": {
                        "description": "one result per text (JSON) or per user id (frames)",
                        "headers": timing_headers(),
                        "content": json_content({"oneOf": [ref("ClassifyResponse"), ref("FramesResponse")]}),
                    },
                    **errors(*CLASSIFY_ERRORS),
                },
            }
        },
        "/predict": {
            "post": {
                "operationId": "tei_predict",
                "summary": "Hugging Face text-embeddings-inference compatible classification",
                "parameters": list(REQUEST_HEADERS),
                "requestBody": {"required": True, "content": json_content(ref("PredictRequest"))},
                "responses": {
                    "200": {
                        "description": "every label, best first: one list, or one list per batch entry",
                        "headers": timing_headers(),
                        "content": json_content(ref("PredictResponse")),
                    },
                    **errors(*CLASSIFY_ERRORS),
                },
            }
        },
        "/v2": {
            "get": {
                "operationId": "v2_server_metadata",
                "responses": {
                    "200": {"description": "server metadata", "content": json_content(ref("ServerMetadata"))},
                },
            }
        },
        "/v2/health/live": {"get": {"operationId": "v2_live", "responses": _v2_health("live")}},
        "/v2/health/ready": {"get": {"operationId": "v2_ready", "responses": _v2_health("ready")}},
        **_v2_model_paths(name_param, []),
        **_v2_model_paths(name_param, [version_param], "/versions/{version}"),
        "/livez": {"get": {"operationId": "livez", "responses": _health("live")}},
        "/readyz": {"get": {"operationId": "readyz", "responses": _health("ready")}},
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "responses": {"200": {"description": "this document", "content": json_content({"type": "object"})}},
            }
        },
        "/docs": {
            "get": {
                "operationId": "api_docs",
                "summary": "this document as a page for a browser (shipped with the server: works offline)",
                "responses": {"200": {"description": "an HTML page that renders /openapi.json",
                                      "content": {"text/html": {"schema": {"type": "string"}}}}},
            }
        },
    }


def _v2_model_paths(name_param: Schema, more: list[Schema], under: str = "") -> dict[str, Schema]:
    """Model metadata, readiness and infer; `under` "/versions/{version}" gives the versioned routes (one version)."""
    params = [name_param, *more]
    suffix = "_version" if under else ""
    base = "/v2/models/{name}" + under
    return {
        base: {
            "get": {
                "operationId": "v2_model_metadata" + suffix,
                "parameters": params,
                "responses": {
                    "200": {"description": "model metadata", "content": json_content(ref("ModelMetadata"))},
                    **errors("404", body=KSERVE_ERROR),
                },
            }
        },
        base + "/ready": {
            "get": {
                "operationId": "v2_model_ready" + suffix,
                "parameters": params,
                "responses": {**_v2_health("ready", named=True), **errors("404", body=KSERVE_ERROR)},
            }
        },
        base + "/infer": {
            "post": {
                "operationId": "v2_infer" + suffix,
                "summary": "Open Inference Protocol infer, with Triton's binary tensor data extension",
                "description": f"Binary requests (as tritonclient sends) put the JSON header first and say its length "
                f"in {HEADER_LENGTH}; BYTES tensors follow as u32 LE length | bytes. Binary outputs come back the "
                "same way, with the same header on the response.",
                "parameters": [*params, *REQUEST_HEADERS],
                "requestBody": {"required": True, "content": json_content(ref("InferRequest"))},
                "responses": {
                    "200": {
                        "description": "the outputs asked for",
                        "headers": {
                            **timing_headers(),
                            HEADER_LENGTH: {"schema": {"type": "string"}, "description": "with binary outputs"},
                        },
                        "content": {
                            **json_content(ref("InferResponse")),
                            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                        },
                    },
                    **errors("404", *CLASSIFY_ERRORS, body=KSERVE_ERROR),
                },
            }
        },
    }


def _v2_health(state: str, named: bool = False) -> Schema:
    """A /v2 probe: the status says it (all tritonclient reads) and the body repeats it (what KServe's client reads)."""
    fields: dict[str, Schema] = {state: {"type": "boolean"}}
    if named:
        fields = {"name": {"type": "string"}, **fields}
    body = json_content(obj(fields, tuple(fields), False))
    return {"200": {"description": state, "content": body}, "503": {"description": "not " + state, "content": body}}


def build_document(model_name: str, max_texts: int, version: str = "0.1.0", *,
                   problem: ProblemType = "single_label_classification", reranker: bool = False,
                   vocab_size: int | None = None) -> dict[str, Any]:
    """The whole document. The model's name, head and vocabulary and the text limit go into the schemas, so build it
    from the live runtime; which operations exist does not depend on them."""
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "glassbox",
            "version": version,
            "description": "Text classification with every stage timed. Errors are "
            '{"error": {"code", "message"}} with a stable code; on the /v2 routes they are {"error": "message"}, '
            "as the Open Inference Protocol defines them.",
        },
        "paths": {**_paths(model_name), **tei_paths(reranker)},
        "components": {"schemas": {**_schemas(max_texts, problem), **tei_schemas(max_texts, vocab_size)}},
    }
