"""The OpenAPI pieces of TEI's surface beyond /predict: /rerank, POST / and /invocations, the health probes, /info,
/tokenize and /decode (merged into the document by glassbox.service.wire.openapi)."""

from __future__ import annotations

from glassbox.service.wire.rerank import Rank
from glassbox.service.wire.schema import (
    CLASSIFY_ERRORS,
    REQUEST_HEADERS,
    TEXT,
    Schema,
    errors,
    json_content,
    obj,
    ref,
    string_list,
    struct_schemas,
    text_list,
    timing_headers,
)
from glassbox.service.wire.tei_tools import SimpleToken

_TRUNCATION = {"truncate": {"type": ["boolean", "null"]}, "truncation_direction": {"enum": ["Right", "right"]}}


def tei_schemas(max_texts: int, vocab_size: int | None) -> dict[str, Schema]:
    token_id: Schema = {"type": "integer", "minimum": 0}
    if vocab_size is not None:
        token_id["maximum"] = vocab_size - 1
    id_list: Schema = {"type": "array", "items": token_id}
    return {
        "RerankRequest": obj(
            {"query": TEXT, "texts": text_list(1, max_texts), **_TRUNCATION,
             "raw_scores": {"type": "boolean"}, "return_text": {"type": "boolean"}},
            ("query", "texts"), True,
        ),
        **struct_schemas(Rank, SimpleToken),  # the responses, from the structs their encoders write
        "RerankResponse": {"type": "array", "items": ref("Rank"), "description": "highest score first"},
        "TokenizeRequest": obj(
            {"inputs": {"oneOf": [{"type": "string"}, string_list(1, max_texts)]},
             "add_special_tokens": {"type": "boolean"},
             "prompt_name": {"type": "null", "description": "glassbox has no prompts: only null is accepted"}},
            ("inputs",), True,
        ),
        "TokenizeResponse": {"type": "array", "items": {"type": "array", "items": ref("SimpleToken")},
                             "description": "one list of tokens per input, not truncated"},
        "DecodeRequest": obj(
            {"ids": {"oneOf": [{**id_list, "minItems": 1},
                               {"type": "array", "items": id_list, "minItems": 1, "maxItems": max_texts}]},
             "skip_special_tokens": {"type": "boolean"}},
            ("ids",), True,
        ),
        "DecodeResponse": {"type": "array", "items": {"type": "string"}},
        "Info": obj(
            {"model_id": {"type": "string"}, "model_dtype": {"type": "string"},
             "model_type": {"type": "object", "description": '{"classifier": ...} or {"reranker": ...}: id2label and '
                            "label2id", "minProperties": 1, "maxProperties": 1},
             "max_input_length": {"type": "integer"}, "max_client_batch_size": {"type": "integer"},
             "max_batch_tokens": {"type": "integer"}, "auto_truncate": {"type": "boolean"},
             "version": {"type": "string"}, "glassbox": {"type": "object"}},
            ("model_id", "model_type", "max_input_length", "max_client_batch_size", "version"), True,
        ),
    }


def _classifying(operation_id: str, summary: str, reranker: bool) -> Schema:
    request, response = ("RerankRequest", "RerankResponse") if reranker else ("PredictRequest", "PredictResponse")
    return {
        "post": {
            "operationId": operation_id,
            "summary": summary,
            "parameters": list(REQUEST_HEADERS),
            "requestBody": {"required": True, "content": json_content(ref(request))},
            "responses": {
                "200": {"description": "as /rerank" if reranker else "as /predict", "headers": timing_headers(),
                        "content": json_content(ref(response))},
                **errors(*CLASSIFY_ERRORS),
            },
        }
    }


def _health(operation_id: str) -> Schema:
    return {"get": {"operationId": operation_id, "summary": "TEI's health probe: an empty 200 while the model serves",
                    "responses": {"200": {"description": "serving"}, **errors("503")}}}


def _tool(operation_id: str, summary: str, request: str, response: str) -> Schema:
    return {
        "post": {
            "operationId": operation_id,
            "summary": summary,
            "requestBody": {"required": True, "content": json_content(ref(request))},
            "responses": {"200": {"description": "done", "content": json_content(ref(response))},
                          **errors("400", "408", "413", "422")},
        }
    }


def tei_paths(reranker: bool) -> dict[str, Schema]:
    """`reranker`: the served model has one output, so POST / and /invocations answer as /rerank (else /predict)."""
    rerank = _classifying("tei_rerank", "TEI reranking: score (query, text) pairs, best first", True)
    rerank["post"]["responses"].update(errors("424"))
    root = _classifying("tei_root", "TEI's base URL: /predict for a classifier, /rerank for a reranker", reranker)
    invocations = _classifying("sagemaker_invocations", "SageMaker's route: as POST /", reranker)
    return {
        "/rerank": rerank,
        "/": {**root, **_health("tei_health_root")},
        "/invocations": invocations,
        "/health": _health("tei_health"),
        "/ping": _health("sagemaker_ping"),
        "/info": {"get": {"operationId": "tei_info", "summary": "the model and the limits, in TEI's shape",
                          "responses": {"200": {"description": "info", "content": json_content(ref("Info"))}}}},
        "/tokenize": _tool("tei_tokenize", "the tokens of each text, with their character spans", "TokenizeRequest",
                           "TokenizeResponse"),
        "/decode": _tool("tei_decode", "token ids back to text", "DecodeRequest", "DecodeResponse"),
    }
