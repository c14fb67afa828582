"""KServe v2 / Open Inference Protocol: metadata, and `infer` with one BYTES input named "text".

Both encodings tritonclient[http] uses are read and written:

- plain JSON: tensors carry `data` (BYTES as strings, FP32 as numbers, flattened row-major);
- Triton's binary tensor data extension: the header `Inference-Header-Content-Length: N` says the first N body
  bytes are the JSON header and the rest is raw tensor data, in input order, each input giving its share in
  `parameters.binary_data_size`. A BYTES tensor is `u32 little-endian length | bytes`, repeated; FP32 is
  little-endian float32. Outputs come back binary when asked per output (`parameters.binary_data`) or for
  all of them (request `parameters.binary_data_output`, which tritonclient sets when it names no outputs).

Outputs: `label` (BYTES [n]), `probabilities` and `logits` (FP32 [n, L]). Triton's classification extension
is honoured on the two FP32 outputs: `parameters.classification: k` turns them into BYTES [n, k] strings
"score:index:label", best first. Shared-memory parameters are refused: this server has no shared memory.
"""

from __future__ import annotations

import codecs
import struct
from dataclasses import dataclass
from importlib import metadata
from typing import Annotated, Any

import msgspec
import numpy as np

from service.errors import InvalidRequestError
from service.types import FloatArray
from service.wire.common import (
    ClassifyRequest,
    ClassifyResult,
    InvalidUtf8Error,
    check_count,
    decode_json,
    ranked,
)

HEADER_LENGTH = "Inference-Header-Content-Length"
INPUT_NAME = "text"
OUTPUT_NAMES = ("label", "probabilities", "logits")
MODEL_VERSION = "1"
PLATFORM = "glassbox"
EXTENSIONS = ("binary_tensor_data", "classification")

_LENGTH = struct.Struct("<I")
_SHARED_MEMORY = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


class TensorError(InvalidRequestError):
    """An input tensor is malformed: wrong name, datatype, shape, data or parameters."""

    code = "invalid_tensor"


class BinaryDataError(InvalidRequestError):
    """The binary tensor data section disagrees with the JSON header or with itself."""

    code = "invalid_binary_data"


class UnknownOutputError(InvalidRequestError):
    code = "unknown_output"


class _InputTensor(msgspec.Struct, frozen=True):
    name: str
    # JSON Schema (and so the OpenAPI document) counts 3.0 as an integer; _dims refuses 2.5.
    shape: list[Annotated[int, msgspec.Meta(ge=0)] | Annotated[float, msgspec.Meta(ge=0)]]
    datatype: str
    parameters: dict[str, Any] = {}
    data: list[Any] | msgspec.UnsetType = msgspec.UNSET


class _OutputSpec(msgspec.Struct, frozen=True):
    name: str
    parameters: dict[str, Any] = {}


class _InferBody(msgspec.Struct, frozen=True):
    inputs: list[_InputTensor]
    outputs: list[_OutputSpec] | msgspec.UnsetType = msgspec.UNSET
    id: str | msgspec.UnsetType = msgspec.UNSET
    parameters: dict[str, Any] = {}


class _OutputTensor(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, int] | None = None
    data: list[Any] | None = None


class _InferResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[_OutputTensor]


@dataclass(frozen=True, slots=True)
class OutputRequest:
    name: str  # one of OUTPUT_NAMES
    binary: bool  # raw bytes after the JSON header instead of JSON `data`
    classification: int = 0  # > 0: the k best "score:index:label" strings instead of the FP32 row


# --- decoding ---------------------------------------------------------------------------------------------------


def _flag(parameters: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = parameters.get(key, default)
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{where} parameter {key!r} must be a boolean")
    return value


def _whole(value: object) -> int | None:
    """A JSON integer, including the 3.0 spelling JSON Schema also calls an integer; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _count(parameters: dict[str, Any], key: str, where: str) -> int | None:
    value = parameters.get(key)
    if value is None:
        return None
    count = _whole(value)
    if count is None or count < 0:
        raise InvalidRequestError(f"{where} parameter {key!r} must be a non-negative integer")
    return count


def _refuse_shared_memory(parameters: dict[str, Any], where: str) -> None:
    if any(key in parameters for key in _SHARED_MEMORY):
        raise InvalidRequestError(f"{where} asks for shared memory, which this server does not offer")


def _split(body: bytes | bytearray | memoryview, header_length: str | None) -> tuple[memoryview, memoryview]:
    view = memoryview(body)
    if header_length is None:
        return view, view[len(view) :]
    raw = header_length.strip()
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19:
        raise BinaryDataError(f"{HEADER_LENGTH} must be a byte count, got {header_length[:40]!r}")
    size = int(raw)
    if not 0 < size <= len(view):
        raise BinaryDataError(f"{HEADER_LENGTH} is {size}, but the body holds {len(view)} bytes")
    return view[:size], view[size:]


def _bytes_elements(blob: memoryview, expected: int) -> list[str]:
    """A serialized BYTES tensor (u32 LE length | bytes, repeated) -> its elements as text."""
    texts: list[str] = []
    offset, size = 0, len(blob)
    while offset < size:
        if len(texts) == expected:
            raise BinaryDataError(f"binary data for {INPUT_NAME!r} holds more elements than its shape's {expected}")
        if size - offset < _LENGTH.size:
            raise BinaryDataError(f"binary data for {INPUT_NAME!r} ends inside an element length at byte {offset}")
        (length,) = _LENGTH.unpack_from(blob, offset)
        start, end = offset + _LENGTH.size, offset + _LENGTH.size + length
        if end > size:
            raise BinaryDataError(f"element {len(texts)} declares {length} bytes but only {size - start} remain")
        try:
            texts.append(codecs.utf_8_decode(blob[start:end], "strict", True)[0])
        except UnicodeDecodeError as exc:
            raise InvalidUtf8Error(f"element {len(texts)} of {INPUT_NAME!r} is not valid UTF-8: {exc.reason}") from None
        offset = end
    return texts


def _json_elements(data: list[Any], expected: int) -> list[str]:
    """JSON `data` (flat, or nested row-major lists) -> its strings, without recursion."""
    texts: list[str] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, str):
                texts.append(item)
                if len(texts) > expected:
                    raise TensorError(f"{INPUT_NAME!r} holds more elements than the {expected} its shape says")
            elif isinstance(item, list):
                stack.append(iter(item))
                break
            else:
                raise TensorError(f"{INPUT_NAME!r} is a BYTES tensor: its data must be strings")
        else:
            stack.pop()
    return texts


def _element_count(shape: list[int | float], max_texts: int) -> int:
    """The number of elements `shape` holds, refused past max_texts as soon as the running product passes it:
    a body of a million large dimensions must not buy a quadratic-time multiplication of huge integers."""
    dims = [_whole(dim) for dim in shape]
    if any(dim is None for dim in dims):
        raise TensorError(f"input {INPUT_NAME!r} has a shape with a fractional dimension")
    if 0 in dims:
        check_count(0, max_texts)
    count = 1
    for dim in dims:
        count *= dim or 0
        check_count(count, max_texts)
    return count


def _outputs(parsed: _InferBody) -> tuple[OutputRequest, ...]:
    default_binary = _flag(parsed.parameters, "binary_data_output", False, "request")
    specs = parsed.outputs if isinstance(parsed.outputs, list) else []
    if not specs:
        return tuple(OutputRequest(name, default_binary) for name in OUTPUT_NAMES)
    asked: list[OutputRequest] = []
    for spec in specs:
        where = f"output {spec.name[:40]!r}"
        if spec.name not in OUTPUT_NAMES:
            raise UnknownOutputError(f"{where} does not exist; outputs are {', '.join(OUTPUT_NAMES)}")
        if any(seen.name == spec.name for seen in asked):
            raise InvalidRequestError(f"{where} is asked for twice")
        _refuse_shared_memory(spec.parameters, where)
        classification = _count(spec.parameters, "classification", where) or 0
        if spec.name == "label":
            classification = 0  # the label output already is the top-1 class; the option changes nothing there
        binary = _flag(spec.parameters, "binary_data", default_binary, where)
        asked.append(OutputRequest(spec.name, binary, classification))
    return tuple(asked)


def decode_infer(
    body: bytes | bytearray | memoryview, header_length: str | None, *, max_texts: int
) -> tuple[ClassifyRequest, tuple[OutputRequest, ...]]:
    """An infer body (and the Inference-Header-Content-Length header, if sent) -> the texts and the outputs asked."""
    header, binary = _split(body, header_length)
    parsed = decode_json(header, _InferBody)
    if len(parsed.inputs) != 1:
        raise TensorError(f"expected exactly one input, {INPUT_NAME!r}; got {len(parsed.inputs)}")
    tensor = parsed.inputs[0]
    if tensor.name != INPUT_NAME:
        raise TensorError(f"unknown input {tensor.name[:40]!r}; the only input is {INPUT_NAME!r}")
    if tensor.datatype != "BYTES":
        raise TensorError(f"input {INPUT_NAME!r} has datatype BYTES, not {tensor.datatype[:40]!r}")
    _refuse_shared_memory(tensor.parameters, f"input {INPUT_NAME!r}")
    expected = _element_count(tensor.shape, max_texts)
    binary_size = _count(tensor.parameters, "binary_data_size", f"input {INPUT_NAME!r}")
    if binary_size is None:
        if len(binary):
            raise BinaryDataError(f"{len(binary)} bytes follow the JSON header but no input declares binary data")
        if not isinstance(tensor.data, list):
            raise TensorError(f"input {INPUT_NAME!r} has neither data nor parameters.binary_data_size")
        texts = _json_elements(tensor.data, expected)
    else:
        if header_length is None:
            raise BinaryDataError(f"input {INPUT_NAME!r} declares binary data but {HEADER_LENGTH} is missing")
        if isinstance(tensor.data, list):
            raise TensorError(f"input {INPUT_NAME!r} has both data and binary data")
        if binary_size != len(binary):
            raise BinaryDataError(
                f"input {INPUT_NAME!r} declares {binary_size} bytes of binary data; {len(binary)} follow the header"
            )
        texts = _bytes_elements(binary, expected)
    if len(texts) != expected:
        raise TensorError(f"input {INPUT_NAME!r} has shape {tensor.shape} ({expected} elements) but {len(texts)}")
    request_id = parsed.id if isinstance(parsed.id, str) else None
    return ClassifyRequest(texts=tuple(texts), request_id=request_id), _outputs(parsed)


# --- encoding ---------------------------------------------------------------------------------------------------


def serialize_bytes(items: list[str]) -> bytes:
    """Strings -> a BYTES tensor in the binary layout (what tritonclient.utils.serialize_byte_tensor makes)."""
    parts: list[bytes] = []
    for item in items:
        data = item.encode("utf-8")
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def _bytes_tensor(out: OutputRequest, shape: list[int], items: list[str]) -> tuple[_OutputTensor, bytes]:
    if not out.binary:
        return _OutputTensor(name=out.name, datatype="BYTES", shape=shape, data=items), b""
    blob = serialize_bytes(items)
    return _OutputTensor(name=out.name, datatype="BYTES", shape=shape, parameters={"binary_data_size": len(blob)}), blob


def _fp32_tensor(out: OutputRequest, matrix: FloatArray) -> tuple[_OutputTensor, bytes]:
    shape = list(matrix.shape)
    if not out.binary:
        return _OutputTensor(name=out.name, datatype="FP32", shape=shape, data=matrix.reshape(-1).tolist()), b""
    blob = np.ascontiguousarray(matrix, dtype="<f4").tobytes()  # row-major little-endian float32
    return _OutputTensor(name=out.name, datatype="FP32", shape=shape, parameters={"binary_data_size": len(blob)}), blob


def _output(out: OutputRequest, result: ClassifyResult) -> tuple[_OutputTensor, bytes]:
    labels, n = result.labels, result.size
    if out.name == "label":
        return _bytes_tensor(out, [n], [labels[i] for i in result.probs.argmax(axis=1).tolist()] if n else [])
    matrix = result.probs if out.name == "probabilities" else result.logits  # [n, L]
    if not out.classification:
        return _fp32_tensor(out, matrix)
    k = min(out.classification, len(labels))
    order = ranked(matrix, k)  # [n, k]
    values = np.take_along_axis(matrix, order, axis=1).tolist()
    strings = [
        f"{v:f}:{j}:{labels[j]}"
        for order_row, value_row in zip(order.tolist(), values, strict=True)
        for j, v in zip(order_row, value_row, strict=True)
    ]
    return _bytes_tensor(out, [n, k], strings)


def encode_infer(
    result: ClassifyResult, request: ClassifyRequest, outputs: tuple[OutputRequest, ...], model_name: str
) -> tuple[bytes, dict[str, str]]:
    """-> (body, extra headers). With any binary output the body is JSON header + blobs in output order, and the
    headers carry Inference-Header-Content-Length; otherwise the body is plain JSON and the headers are empty."""
    tensors: list[_OutputTensor] = []
    blobs: list[bytes] = []
    for out in outputs:
        tensor, blob = _output(out, result)
        tensors.append(tensor)
        blobs.append(blob)
    header = msgspec.json.encode(
        _InferResponse(model_name=model_name, model_version=MODEL_VERSION, id=request.request_id, outputs=tensors)
    )
    if not any(out.binary for out in outputs):
        return header, {}
    return header + b"".join(blobs), {HEADER_LENGTH: str(len(header))}


# --- metadata ---------------------------------------------------------------------------------------------------


def server_metadata() -> dict[str, Any]:
    try:
        version = metadata.version("glassbox-serve")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {"name": PLATFORM, "version": version, "extensions": list(EXTENSIONS)}


def model_metadata(model_name: str, labels: tuple[str, ...]) -> dict[str, Any]:
    width = len(labels)
    return {
        "name": model_name,
        "versions": [MODEL_VERSION],
        "platform": PLATFORM,
        "inputs": [{"name": INPUT_NAME, "datatype": "BYTES", "shape": [-1]}],
        "outputs": [
            {"name": "label", "datatype": "BYTES", "shape": [-1]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, width]},
            {"name": "logits", "datatype": "FP32", "shape": [-1, width]},
        ],
    }
