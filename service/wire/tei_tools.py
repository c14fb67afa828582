"""TEI's routes around the model: `POST /tokenize`, `POST /decode` and `GET /info`, in TEI's shapes.

- `/tokenize` `{"inputs": str | [str, ...], "add_special_tokens": true}` -> one list of tokens per input (a list of
  one list for a single string): `{"id", "text", "special", "start", "stop"}`, where `text` is the slice of the input
  the token covers and `start`/`stop` its character offsets (null for special tokens, whose `text` is the token
  itself). Texts are not truncated here: the answer shows every token. `prompt_name` is refused (glassbox has no
  sentence-transformers prompts).
- `/decode` `{"ids": [int, ...] | [[int, ...], ...], "skip_special_tokens": true}` -> one string per id list.
- `/info`: the model and the server's limits under TEI's field names, plus a `glassbox` object with what TEI has
  no field for (family, head, device, engine).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from glassbox.service.errors import InvalidRequestError
from glassbox.service.tokenizer import TokenInfo
from glassbox.service.types import ProblemType
from glassbox.service.wire.common import check_count, decode_json


class TokenizeBody(msgspec.Struct, frozen=True):
    inputs: str | list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None


class SimpleToken(msgspec.Struct, frozen=True):
    """One token, as TEI answers /tokenize."""

    id: Annotated[int, msgspec.Meta(ge=0)]
    text: str
    special: bool
    start: Annotated[int, msgspec.Meta(ge=0)] | None
    stop: Annotated[int, msgspec.Meta(ge=0)] | None


class DecodeBody(msgspec.Struct, frozen=True):
    ids: list[Any]  # [int, ...] or [[int, ...], ...]; msgspec takes one array type per union, so checked below
    skip_special_tokens: bool = True


def decode_tokenize(body: bytes | bytearray | memoryview, *, max_texts: int) -> tuple[list[str], bool]:
    """-> (the texts, add_special_tokens)."""
    parsed = decode_json(body, TokenizeBody)
    if parsed.prompt_name is not None:
        raise InvalidRequestError("prompt_name is not supported: glassbox has no sentence-transformers prompts")
    texts = [parsed.inputs] if isinstance(parsed.inputs, str) else parsed.inputs
    check_count(len(texts), max_texts, "inputs")
    return texts, parsed.add_special_tokens


def encode_tokens(tokens: list[list[TokenInfo]]) -> bytes:
    return msgspec.json.encode([[SimpleToken(t.id, t.text, t.special, t.start, t.stop) for t in row]
                                for row in tokens])


def encode_texts(texts: list[str]) -> bytes:
    return msgspec.json.encode(texts)


def decode_ids(body: bytes | bytearray | memoryview, *, max_texts: int) -> tuple[list[list[int]], bool]:
    """-> (the id lists, skip_special_tokens). A flat list is one sequence, as in TEI."""
    parsed = decode_json(body, DecodeBody)
    ids = parsed.ids
    if not ids:
        check_count(0, max_texts, "id lists")
    sequences = ids if isinstance(ids[0], list) else [ids]  # a flat list is one sequence
    check_count(len(sequences), max_texts, "id lists")
    checked: list[list[int]] = []
    for row, sequence in enumerate(sequences):
        if not isinstance(sequence, list) or not all(_is_id(token) for token in sequence):
            raise InvalidRequestError(f"ids[{row}] is not a list of token ids; send [id, ...] or [[id, ...], ...] with "
                                      "non-negative integers")
        checked.append([int(token) for token in sequence])
    return checked, parsed.skip_special_tokens


def _is_id(value: object) -> bool:
    """A non-negative JSON integer, 3.0 included (JSON Schema calls it an integer too)."""
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return whole and not isinstance(value, bool) and value >= 0  # type: ignore[operator]


def info(*, model_name: str, labels: tuple[str, ...], problem: ProblemType, dtype: str, max_input_length: int,
         settings: dict[str, int | bool], version: str, extra: dict[str, Any]) -> dict[str, Any]:
    """TEI's Info object. A model with one output is a `reranker` in TEI's terms (POST / goes to /rerank),
    any other a `classifier`."""
    kind = "reranker" if len(labels) == 1 else "classifier"
    return {
        "model_id": model_name,
        "model_sha": None,
        "model_dtype": dtype,
        "model_type": {kind: {"id2label": {str(i): name for i, name in enumerate(labels)},
                              "label2id": {name: i for i, name in enumerate(labels)}}},
        **settings,
        "max_input_length": max_input_length,
        "tokenization_workers": 1,
        "version": version,
        "sha": None,
        "docker_label": None,
        "glassbox": {"problem_type": problem, **extra},
    }
