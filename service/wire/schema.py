"""Small builders of OpenAPI / JSON Schema pieces, shared by the documents in openapi.py and openapi_tei.py."""

from __future__ import annotations

from typing import Any

import msgspec

Schema = dict[str, Any]
REF_TEMPLATE = "#/components/schemas/{name}"

ERROR_STATUSES = {
    "400": "The body could not be understood (bad JSON, wrong types, bad frames, invalid UTF-8)",
    "401": "The API key is missing or wrong (servers started with --api-key)",
    "404": "No such route, model or model version",
    "408": "The request did not arrive in time",
    "413": "Too many texts, a text too long with truncation off, or a body over the size cap",
    "415": "Unsupported Content-Type",
    "422": "Nothing to classify",
    "424": "The served model cannot do this (/rerank on a model with more than one output)",
    "429": "Overloaded: retry after the number of seconds in Retry-After",
    "431": "The request's header block is over the size cap",
    "500": "The engine failed the batch, or a bug (logged)",
    "503": "Not ready (loading, draining, or the engine process restarting): retry after Retry-After",
    "504": "The request's deadline passed before it ran",
}
CLASSIFY_ERRORS = ("400", "408", "413", "415", "422", "429", "431", "500", "503", "504")
# Request headers every classify route reads.
REQUEST_HEADERS = (
    {"name": "X-Request-Id", "in": "header", "schema": {"type": "string"},
     "description": "echoed in the answer and the logs; generated when absent"},
    {"name": "X-Request-Timeout-Ms", "in": "header",
     "schema": {"type": "number", "exclusiveMinimum": 0, "maximum": 3_600_000},
     "description": "this request's deadline in milliseconds (default --request-timeout-ms)"},
)


def ref(name: str) -> Schema:
    return {"$ref": REF_TEMPLATE.format(name=name)}


def struct_schemas(*types: type[msgspec.Struct]) -> dict[str, Schema]:
    """The components of msgspec structs, named as the classes, with every struct they hold: the encoder's own
    types are the one statement of a response's shape, and the document is derived from them."""
    _, components = msgspec.json.schema_components(types, ref_template=REF_TEMPLATE)
    return components


def json_content(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


def errors(*statuses: str, body: str = "Error") -> dict[str, Schema]:
    """Error responses by status; `body` names the schema (the /v2 routes answer the protocol's "KServeError")."""
    responses: dict[str, Schema] = {}
    for status in statuses:
        response: Schema = {"description": ERROR_STATUSES[status], "content": json_content(ref(body))}
        if status in ("429", "503"):
            response["headers"] = {"Retry-After": {"schema": {"type": "integer", "minimum": 0}}}
        if status == "401":
            response["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
        responses[status] = response
    return responses


def obj(properties: Schema, required: tuple[str, ...] = (), additional: bool = False) -> Schema:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": additional}


def string_list(min_items: int, max_items: int) -> Schema:
    return {"type": "array", "items": {"type": "string"}, "minItems": min_items, "maxItems": max_items}


# A text to classify: an empty one has nothing to classify and is refused (422 empty_input), as TEI refuses it.
TEXT: Schema = {"type": "string", "minLength": 1}


def text_list(min_items: int, max_items: int) -> Schema:
    return {"type": "array", "items": TEXT, "minItems": min_items, "maxItems": max_items}


def timing_headers() -> Schema:
    return {
        "X-Request-Id": {"schema": {"type": "string"}, "description": "echoed from the request, or generated"},
        "X-Latency-ms": {"schema": {"type": "string"}, "description": "server time for the request, in ms"},
        "Server-Timing": {"schema": {"type": "string"}, "description": "parse, tokenize, queue, infer, postprocess"},
    }
