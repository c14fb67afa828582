"""The OpenAPI 3.1 document the app serves at /openapi.json, built as a plain dict.

The schemas say what the decoders accept, as tightly as JSON Schema can: request bodies that fit them are
answered 200 and bodies that do not are answered 4xx. Three rules cannot be written in JSON Schema and are
stated in descriptions instead: a KServe input's `data` must hold exactly as many strings as its `shape`
multiplies to; a KServe output may be named only once; a frames body must be well-formed frames.
"""

from __future__ import annotations

from typing import Any

from service.wire.common import TOP_K_MAX
from service.wire.frames import CONTENT_TYPE as FRAMES
from service.wire.kserve import HEADER_LENGTH, INPUT_NAME, OUTPUT_NAMES

Schema = dict[str, Any]
OPENAPI_VERSION = "3.1.0"

_ERROR_STATUSES = {
    "400": "The body could not be understood (bad JSON, wrong types, bad frames, invalid UTF-8)",
    "404": "No such route or model",
    "408": "The request did not arrive in time",
    "413": "Too many texts, a text too long with truncation off, or a body over the size cap",
    "415": "Unsupported Content-Type",
    "422": "Nothing to classify",
    "429": "Overloaded: retry after the number of seconds in Retry-After",
    "503": "Not ready (loading or draining)",
    "504": "The request's deadline passed before it ran",
}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


def _errors(*statuses: str) -> dict[str, Schema]:
    responses: dict[str, Schema] = {}
    for status in statuses:
        response: Schema = {"description": _ERROR_STATUSES[status], "content": _json(_ref("Error"))}
        if status == "429":
            response["headers"] = {"Retry-After": {"schema": {"type": "integer", "minimum": 0}}}
        responses[status] = response
    return responses


_CLASSIFY_ERRORS = ("400", "408", "413", "415", "422", "429", "503", "504")


def _obj(properties: Schema, required: tuple[str, ...] = (), additional: bool = False) -> Schema:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": additional}


def _string_list(min_items: int, max_items: int) -> Schema:
    return {"type": "array", "items": {"type": "string"}, "minItems": min_items, "maxItems": max_items}


def _schemas(max_texts: int) -> dict[str, Schema]:
    top_k: Schema = {"type": ["integer", "null"], "minimum": 1, "maximum": TOP_K_MAX}
    options: Schema = {"top_k": top_k, "all_scores": {"type": "boolean"}}
    label_score = _obj({"label": {"type": "string"}, "score": {"type": "number"}}, ("label", "score"))
    text_result = _obj(
        {
            "label": {"type": "string"},
            "score": {"type": "number", "description": "probability of `label`"},
            "scores": {"type": "array", "items": _ref("LabelScore"), "description": "only with top_k or all_scores"},
            "tokens": {"type": "integer", "minimum": 0},
            "truncated": {"type": "boolean"},
        },
        ("label", "score", "tokens", "truncated"),
    )
    prediction = _obj({"score": {"type": "number"}, "label": {"type": "string"}}, ("score", "label"))
    one_text_list = _string_list(1, 1)
    tensor_meta = _obj(
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
    return {
        "Error": _obj(
            {"error": _obj({"code": {"type": "string"}, "message": {"type": "string"}}, ("code", "message"), True)},
            ("error",),
            True,
        ),
        "ClassifyRequest": {
            "description": 'Exactly one of "text" or "texts"; unknown fields are refused.',
            "oneOf": [
                _obj({"text": {"type": "string"}, **options}, ("text",)),
                _obj({"texts": _string_list(1, max_texts), **options}, ("texts",)),
            ],
        },
        "LabelScore": label_score,
        "TextResult": text_result,
        "ClassifyResponse": _obj(
            {"model": {"type": "string"}, "results": {"type": "array", "items": _ref("TextResult")}},
            ("model", "results"),
        ),
        "FramesResponse": _obj(
            {
                "model": {"type": "string"},
                "results": {
                    "type": "object",
                    "description": "keyed by user id, in decimal",
                    "propertyNames": {"pattern": "^[0-9]+$"},
                    "additionalProperties": _ref("TextResult"),
                },
            },
            ("model", "results"),
        ),
        "PredictRequest": _obj(
            {
                "inputs": {
                    "description": "One text (a string, or a one-string list) or a batch of one-string lists. "
                    "Pairs of texts are refused.",
                    "oneOf": [
                        {"type": "string"},
                        one_text_list,
                        {"type": "array", "items": one_text_list, "minItems": 1, "maxItems": max_texts},
                    ],
                },
                "truncate": {"type": ["boolean", "null"]},
                "truncation_direction": {"enum": ["Right", "right"]},
                "raw_scores": {"type": "boolean"},
            },
            ("inputs",),
            True,
        ),
        "Prediction": prediction,
        "PredictResponse": {
            "oneOf": [
                {"type": "array", "items": _ref("Prediction"), "minItems": 1},
                {"type": "array", "items": {"type": "array", "items": _ref("Prediction")}, "minItems": 1},
            ]
        },
        "ServerMetadata": _obj(
            {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "extensions": {"type": "array", "items": {"type": "string"}},
            },
            ("name", "version", "extensions"),
            True,
        ),
        "TensorMetadata": tensor_meta,
        "ModelMetadata": _obj(
            {
                "name": {"type": "string"},
                "versions": {"type": "array", "items": {"type": "string"}},
                "platform": {"type": "string"},
                "inputs": {"type": "array", "items": _ref("TensorMetadata")},
                "outputs": {"type": "array", "items": _ref("TensorMetadata")},
            },
            ("name", "platform", "inputs", "outputs"),
            True,
        ),
        "InferRequest": _obj(
            {
                "id": {"type": "string"},
                "parameters": _obj({"binary_data_output": {"type": "boolean"}}, (), True),
                "inputs": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 1,
                    "items": _obj(
                        {
                            "name": {"const": INPUT_NAME},
                            "datatype": {"const": "BYTES"},
                            "shape": {
                                "type": "array",
                                "items": {"type": "integer", "minimum": 1, "maximum": max_texts},
                            },
                            "data": {
                                "type": "array",
                                "minItems": 1,
                                "maxItems": max_texts,
                                "items": {"type": "string"},
                                "description": "as many strings as `shape` multiplies to",
                            },
                            "parameters": _obj({"binary_data_size": False, **no_shared_memory}, (), True),
                        },
                        ("name", "datatype", "shape", "data"),
                        True,
                    ),
                },
                "outputs": {
                    "type": "array",
                    "maxItems": len(OUTPUT_NAMES),
                    "description": "each output at most once; none listed means all of them",
                    "items": {
                        "anyOf": [
                            _obj(
                                {"name": {"const": "label"}, "parameters": _obj(output_parameters, (), True)},
                                ("name",),
                                True,
                            ),
                            _obj(
                                {
                                    "name": {"enum": [n for n in OUTPUT_NAMES if n != "label"]},
                                    "parameters": _obj(
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
        "OutputTensor": _obj(
            {
                "name": {"enum": list(OUTPUT_NAMES)},
                "datatype": {"enum": ["BYTES", "FP32"]},
                "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                "parameters": _obj({"binary_data_size": {"type": "integer", "minimum": 0}}, (), True),
                "data": {"type": "array", "items": {"type": ["string", "number", "null"]}},
            },
            ("name", "datatype", "shape"),
            True,
        ),
        "InferResponse": _obj(
            {
                "model_name": {"type": "string"},
                "model_version": {"type": "string"},
                "id": {"type": "string"},
                "outputs": {"type": "array", "items": _ref("OutputTensor")},
            },
            ("model_name", "outputs"),
            True,
        ),
    }


def _timing_headers() -> Schema:
    return {
        "X-Request-Id": {"schema": {"type": "string"}, "description": "echoed from the request, or generated"},
        "X-Latency-ms": {"schema": {"type": "string"}, "description": "server time for the request, in ms"},
        "Server-Timing": {"schema": {"type": "string"}, "description": "parse, tokenize, queue, infer, postprocess"},
    }


def _health(description: str) -> Schema:
    status = _obj({"status": {"type": "string"}}, ("status",), True)
    return {
        "200": {"description": description, "content": _json(status)},
        "503": {"description": "not " + description, "content": _json(status)},
    }


def _paths(model_name: str) -> dict[str, Schema]:
    name_param = {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "enum": [model_name]}}
    query_options = [
        {"name": "top_k", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": TOP_K_MAX}},
        {"name": "all_scores", "in": "query", "schema": {"type": "boolean"}},
    ]
    # A Media Type Object has no description field (OpenAPI 3.1 refuses unknown ones), so the schema carries it.
    frames_body = {
        "schema": {
            "type": "string",
            "format": "binary",
            "description": "frames of u32 LE text length | UTF-8 text | u64 LE user id, back to back; user ids unique",
        },
    }
    return {
        "/v1/classify": {
            "post": {
                "operationId": "classify",
                "summary": "Classify texts (JSON or binary frames, by Content-Type)",
                "description": "top_k and all_scores in the query string apply to frames bodies and are defaults "
                "that a JSON body's own fields override.",
                "parameters": query_options,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("ClassifyRequest")}, FRAMES: frames_body},
                },
                "responses": {
                    "200": {
                        "description": "one result per text (JSON) or per user id (frames)",
                        "headers": _timing_headers(),
                        "content": _json({"oneOf": [_ref("ClassifyResponse"), _ref("FramesResponse")]}),
                    },
                    **_errors(*_CLASSIFY_ERRORS),
                },
            }
        },
        "/predict": {
            "post": {
                "operationId": "tei_predict",
                "summary": "Hugging Face text-embeddings-inference compatible classification",
                "requestBody": {"required": True, "content": _json(_ref("PredictRequest"))},
                "responses": {
                    "200": {
                        "description": "every label, best first: one list, or one list per batch entry",
                        "headers": _timing_headers(),
                        "content": _json(_ref("PredictResponse")),
                    },
                    **_errors(*_CLASSIFY_ERRORS),
                },
            }
        },
        "/v2": {
            "get": {
                "operationId": "v2_server_metadata",
                "responses": {"200": {"description": "server metadata", "content": _json(_ref("ServerMetadata"))}},
            }
        },
        "/v2/health/live": {"get": {"operationId": "v2_live", "responses": _no_body("live")}},
        "/v2/health/ready": {"get": {"operationId": "v2_ready", "responses": _no_body("ready")}},
        "/v2/models/{name}": {
            "get": {
                "operationId": "v2_model_metadata",
                "parameters": [name_param],
                "responses": {
                    "200": {"description": "model metadata", "content": _json(_ref("ModelMetadata"))},
                    **_errors("404"),
                },
            }
        },
        "/v2/models/{name}/ready": {
            "get": {
                "operationId": "v2_model_ready",
                "parameters": [name_param],
                "responses": {**_no_body("ready"), **_errors("404")},
            }
        },
        "/v2/models/{name}/infer": {
            "post": {
                "operationId": "v2_infer",
                "summary": "Open Inference Protocol infer, with Triton's binary tensor data extension",
                "description": f"Binary requests (as tritonclient sends) put the JSON header first and say its length "
                f"in {HEADER_LENGTH}; BYTES tensors follow as u32 LE length | bytes. Binary outputs come back the "
                "same way, with the same header on the response.",
                "parameters": [name_param],
                "requestBody": {"required": True, "content": _json(_ref("InferRequest"))},
                "responses": {
                    "200": {
                        "description": "the outputs asked for",
                        "headers": {
                            **_timing_headers(),
                            HEADER_LENGTH: {"schema": {"type": "string"}, "description": "with binary outputs"},
                        },
                        "content": {
                            **_json(_ref("InferResponse")),
                            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                        },
                    },
                    **_errors("404", *_CLASSIFY_ERRORS),
                },
            }
        },
        "/livez": {"get": {"operationId": "livez", "responses": _health("live")}},
        "/readyz": {"get": {"operationId": "readyz", "responses": _health("ready")}},
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "responses": {"200": {"description": "this document", "content": _json({"type": "object"})}},
            }
        },
    }


def _no_body(state: str) -> Schema:
    return {"200": {"description": state}, "503": {"description": "not " + state}}


def build_document(model_name: str, max_texts: int, version: str = "0.1.0") -> dict[str, Any]:
    """The whole document. `model_name` and `max_texts` go into the schemas, so build it from the live settings."""
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "glassbox",
            "version": version,
            "description": "Text classification with every stage timed. Errors are "
            '{"error": {"code", "message"}} with a stable code.',
        },
        "paths": _paths(model_name),
        "components": {"schemas": _schemas(max_texts)},
    }
