"""KServe v2 / Open Inference Protocol: metadata, and `infer` with a BYTES input named "text" (and, for text pairs,
a second BYTES input named "text_pair" of the same shape: element i is the second text of element i).

Both encodings tritonclient[http] uses are read and written:

- plain JSON: tensors carry `data` (BYTES as strings, FP32 as numbers, flattened row-major);
- Triton's binary tensor data extension: the header `Inference-Header-Content-Length: N` says the first N body
  bytes are the JSON header and the rest is raw tensor data, in input order, each input giving its share in
  `parameters.binary_data_size`. A BYTES tensor is `u32 little-endian length | bytes`, repeated; FP32 is
  little-endian float32. Outputs come back binary when asked per output (`parameters.binary_data`) or for
  all of them (request `parameters.binary_data_output`, which tritonclient sets when it names no outputs).

Outputs: `label` (BYTES [n]), `probabilities` and `logits` (FP32 [n, L]); `probabilities` are the head's scores
(softmax, or one sigmoid per label for a multi-label head). A regression model has `score` (FP32 [n], the number it
outputs) and `logits` instead. Triton's classification extension is honoured on `probabilities` and `logits`:
`parameters.classification: k` turns them into BYTES [n, k] strings "score:index:label", best first.
Shared-memory parameters are refused: this server has no shared memory.
"""

from __future__ import annotations

import codecs
import struct
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from glassbox.service.classification import ClassifyRequest, ClassifyResult
from glassbox.service.errors import InvalidRequestError
from glassbox.service.types import FloatArray, ProblemType
from glassbox.service.version import version as package_version
from glassbox.service.wire.common import InvalidUtf8Error, check_count, decode_json, ranked

HEADER_LENGTH = "Inference-Header-Content-Length"
INPUT_NAME = "text"
PAIR_INPUT_NAME = "text_pair"
OUTPUT_NAMES = ("label", "probabilities", "logits")
REGRESSION_OUTPUT_NAMES = ("score", "logits")
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


_ITEMS_ARE_SCALARS = msgspec.Meta(extra_json_schema={"items": {"type": ["string", "number", "null"]}})


class OutputTensor(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    datatype: Literal["BYTES", "FP32"]
    shape: list[Annotated[int, msgspec.Meta(ge=0)]]
    parameters: Annotated[dict[str, Annotated[int, msgspec.Meta(ge=0)]] | None, msgspec.Meta(
        description="binary_data_size, when the data follows the JSON header as binary")] = None
    data: Annotated[list[Any], _ITEMS_ARE_SCALARS] | None = None


class InferResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The outputs asked for (all of them when none was named)."""

    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[OutputTensor]


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


def _bytes_elements(blob: memoryview, expected: int, name: str) -> list[str]:
    """A serialized BYTES tensor (u32 LE length | bytes, repeated) -> its elements as text."""
    texts: list[str] = []
    offset, size = 0, len(blob)
    while offset < size:
        if len(texts) == expected:
            raise BinaryDataError(f"binary data for {name!r} holds more elements than its shape's {expected}")
        if size - offset < _LENGTH.size:
            raise BinaryDataError(f"binary data for {name!r} ends inside an element length at byte {offset}")
        (length,) = _LENGTH.unpack_from(blob, offset)
        start, end = offset + _LENGTH.size, offset + _LENGTH.size + length
        if end > size:
            raise BinaryDataError(f"element {len(texts)} declares {length} bytes but only {size - start} remain")
        try:
            texts.append(codecs.utf_8_decode(blob[start:end], "strict", True)[0])
        except UnicodeDecodeError as exc:
            raise InvalidUtf8Error(f"element {len(texts)} of {name!r} is not valid UTF-8: {exc.reason}") from None
        offset = end
    return texts


def _json_elements(data: list[Any], expected: int, name: str) -> list[str]:
    """JSON `data` (flat, or nested row-major lists) -> its strings, without recursion."""
    texts: list[str] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, str):
                texts.append(item)
                if len(texts) > expected:
                    raise TensorError(f"{name!r} holds more elements than the {expected} its shape says")
            elif isinstance(item, list):
                stack.append(iter(item))
                break
            else:
                raise TensorError(f"{name!r} is a BYTES tensor: its data must be strings")
        else:
            stack.pop()
    return texts


def _element_count(shape: list[int | float], max_texts: int, name: str) -> int:
    """The number of elements `shape` holds, refused past max_texts as soon as the running product passes it:
    a body of a million large dimensions must not buy a quadratic-time multiplication of huge integers."""
    dims = [_whole(dim) for dim in shape]
    if any(dim is None for dim in dims):
        raise TensorError(f"input {name!r} has a shape with a fractional dimension")
    if 0 in dims:
        check_count(0, max_texts)
    count = 1
    for dim in dims:
        count *= dim or 0
        check_count(count, max_texts)
    return count


def output_names(problem: ProblemType) -> tuple[str, ...]:
    return REGRESSION_OUTPUT_NAMES if problem == "regression" else OUTPUT_NAMES


def _outputs(parsed: _InferBody, names: tuple[str, ...]) -> tuple[OutputRequest, ...]:
    default_binary = _flag(parsed.parameters, "binary_data_output", False, "request")
    specs = parsed.outputs if isinstance(parsed.outputs, list) else []
    if not specs:
        return tuple(OutputRequest(name, default_binary) for name in names)
    asked: list[OutputRequest] = []
    for spec in specs:
        where = f"output {spec.name[:40]!r}"
        if spec.name not in names:
            raise UnknownOutputError(f"{where} does not exist; outputs are {', '.join(names)}")
        if any(seen.name == spec.name for seen in asked):
            raise InvalidRequestError(f"{where} is asked for twice")
        _refuse_shared_memory(spec.parameters, where)
        classification = _count(spec.parameters, "classification", where) or 0
        if spec.name in ("label", "score"):
            classification = 0  # the top-1 class already, or a number without classes: the option changes nothing
        binary = _flag(spec.parameters, "binary_data", default_binary, where)
        asked.append(OutputRequest(spec.name, binary, classification))
    return tuple(asked)


def _tensor_texts(tensor: _InputTensor, binary: memoryview, header_length: str | None, max_texts: int) -> list[str]:
    """One BYTES input's elements, from its JSON `data` or from its share of the binary section (`binary`)."""
    name = tensor.name
    if tensor.datatype != "BYTES":
        raise TensorError(f"input {name!r} must have datatype BYTES, not {tensor.datatype[:40]!r}")
    _refuse_shared_memory(tensor.parameters, f"input {name!r}")
    expected = _element_count(tensor.shape, max_texts, name)
    if _count(tensor.parameters, "binary_data_size", f"input {name!r}") is None:
        if not isinstance(tensor.data, list):
            raise TensorError(f"input {name!r} has neither data nor parameters.binary_data_size")
        texts = _json_elements(tensor.data, expected, name)
    else:
        if header_length is None:
            raise BinaryDataError(f"input {name!r} declares binary data but {HEADER_LENGTH} is missing")
        if isinstance(tensor.data, list):
            raise TensorError(f"input {name!r} has both data and binary data")
        texts = _bytes_elements(binary, expected, name)
    if len(texts) != expected:
        shape = str(tensor.shape)
        shape = shape if len(shape) <= 80 else shape[:80] + "...]"  # a million dimensions is no message
        raise TensorError(f"input {name!r} has shape {shape} ({expected} elements) but {len(texts)} "
                          "element(s) were sent")
    return texts


def _inputs(parsed: _InferBody) -> list[_InputTensor]:
    """The inputs in the order they came (their binary data follows in that order), checked by name."""
    names = [tensor.name for tensor in parsed.inputs]
    allowed = (INPUT_NAME, PAIR_INPUT_NAME)
    for name in names:
        if name not in allowed:
            raise TensorError(f"unknown input {name[:40]!r}; the inputs are {INPUT_NAME!r} and, for text pairs, "
                              f"{PAIR_INPUT_NAME!r}")
    if INPUT_NAME not in names or len(names) != len(set(names)):
        raise TensorError(f"expected the input {INPUT_NAME!r} once (and {PAIR_INPUT_NAME!r} at most once); "
                          f"got {', '.join(repr(n[:40]) for n in names) or 'none'}")
    return parsed.inputs


def decode_infer(
    body: bytes | bytearray | memoryview, header_length: str | None, *, max_texts: int,
    problem: ProblemType = "single_label_classification",
) -> tuple[ClassifyRequest, tuple[OutputRequest, ...]]:
    """An infer body (and the Inference-Header-Content-Length header, if sent) -> the texts and the outputs asked."""
    header, binary = _split(body, header_length)
    parsed = decode_json(header, _InferBody)
    found: dict[str, list[str]] = {}
    offset = 0
    for tensor in _inputs(parsed):
        size = _count(tensor.parameters, "binary_data_size", f"input {tensor.name!r}")
        share = binary[offset : offset + size] if size is not None else binary[:0]
        if size is not None and len(share) != size:
            raise BinaryDataError(f"input {tensor.name!r} declares {size} bytes of binary data; "
                                  f"{len(binary) - offset} follow the header")
        offset += size or 0
        found[tensor.name] = _tensor_texts(tensor, share, header_length, max_texts)
    if offset != len(binary):
        declared = "no input declares binary data" if offset == 0 else f"the inputs declare {offset}"
        raise BinaryDataError(f"{len(binary)} bytes follow the JSON header but {declared}")
    texts = found[INPUT_NAME]
    seconds = found.get(PAIR_INPUT_NAME)
    if seconds is not None and len(seconds) != len(texts):
        raise TensorError(f"input {PAIR_INPUT_NAME!r} holds {len(seconds)} texts for {len(texts)} in {INPUT_NAME!r}; "
                          "send one second text per text")
    request_id = parsed.id if isinstance(parsed.id, str) else None
    request = ClassifyRequest(texts=tuple(texts), pairs=None if seconds is None else tuple(seconds),
                              request_id=request_id)
    return request, _outputs(parsed, output_names(problem))


# --- encoding ---------------------------------------------------------------------------------------------------


def serialize_bytes(items: list[str]) -> bytes:
    """Strings -> a BYTES tensor in the binary layout (what tritonclient.utils.serialize_byte_tensor makes)."""
    parts: list[bytes] = []
    for item in items:
        data = item.encode("utf-8")
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def _bytes_tensor(out: OutputRequest, shape: list[int], items: list[str]) -> tuple[OutputTensor, bytes]:
    if not out.binary:
        return OutputTensor(name=out.name, datatype="BYTES", shape=shape, data=items), b""
    blob = serialize_bytes(items)
    return OutputTensor(name=out.name, datatype="BYTES", shape=shape, parameters={"binary_data_size": len(blob)}), blob


def _fp32_tensor(out: OutputRequest, matrix: FloatArray) -> tuple[OutputTensor, bytes]:
    shape = list(matrix.shape)
    if not out.binary:
        return OutputTensor(name=out.name, datatype="FP32", shape=shape, data=matrix.reshape(-1).tolist()), b""
    blob = np.ascontiguousarray(matrix, dtype="<f4").tobytes()  # row-major little-endian float32
    return OutputTensor(name=out.name, datatype="FP32", shape=shape, parameters={"binary_data_size": len(blob)}), blob


def _output(out: OutputRequest, result: ClassifyResult) -> tuple[OutputTensor, bytes]:
    labels, n = result.labels, result.size
    if out.name == "score":
        return _fp32_tensor(out, result.probs[:, 0])  # [n]: a regression head's number
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
    tensors: list[OutputTensor] = []
    blobs: list[bytes] = []
    for out in outputs:
        tensor, blob = _output(out, result)
        tensors.append(tensor)
        blobs.append(blob)
    header = msgspec.json.encode(
        InferResponse(model_name=model_name, model_version=MODEL_VERSION, id=request.request_id, outputs=tensors)
    )
    if not any(out.binary for out in outputs):
        return header, {}
    return header + b"".join(blobs), {HEADER_LENGTH: str(len(header))}


# --- health and metadata ----------------------------------------------------------------------------------------


def live_status(live: bool) -> dict[str, bool]:
    """The server-live body. The status (200 or 503) is the answer for tritonclient, which reads nothing else; KServe's
    own client (kserve.InferenceRESTClient) reads this body, `{"live": bool}` as KServe's server answers, and fails on
    an empty one."""
    return {"live": live}


def ready_status(ready: bool) -> dict[str, bool]:
    """The server-ready body, `{"ready": bool}` (see live_status)."""
    return {"ready": ready}


def model_ready_status(model_name: str, ready: bool) -> dict[str, str | bool]:
    """The model-ready body, `{"name", "ready"}`, the protocol's $ready_model_response (see live_status)."""
    return {"name": model_name, "ready": ready}


def server_metadata() -> dict[str, Any]:
    version = package_version()
    return {"name": PLATFORM, "version": version, "extensions": list(EXTENSIONS)}


def model_metadata(model_name: str, labels: tuple[str, ...],
                   problem: ProblemType = "single_label_classification", pairs: bool = False) -> dict[str, Any]:
    """`pairs`: the model takes text pairs, so the optional second input is listed too."""
    width = len(labels)
    shapes = {"label": ("BYTES", [-1]), "probabilities": ("FP32", [-1, width]), "logits": ("FP32", [-1, width]),
              "score": ("FP32", [-1])}
    inputs = [{"name": name, "datatype": "BYTES", "shape": [-1]} for name in (INPUT_NAME, PAIR_INPUT_NAME)]
    return {
        "name": model_name,
        "versions": [MODEL_VERSION],
        "platform": PLATFORM,
        "inputs": inputs if pairs else inputs[:1],
        "outputs": [{"name": name, "datatype": shapes[name][0], "shape": shapes[name][1]}
                    for name in output_names(problem)],
    }
