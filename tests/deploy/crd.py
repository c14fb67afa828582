"""Strict validation of custom resources against models generated from their CRDs' own schemas.

kubernetes-validate knows only the built-in kinds. The cloudcoil model packages (cloudcoil-models-keda,
cloudcoil-models-prometheus-operator) are pydantic models generated from the KEDA and Prometheus Operator CRDs:
validating a manifest with them checks types, enums and required fields; pydantic ignores unknown keys, so
`unknown_fields` walks the models to reject those too, as `kubectl apply --validate=strict` would.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel


def unknown_fields(data: Any, annotation: Any, path: str = "") -> list[str]:
    """Paths of keys in `data` that the model type `annotation` does not declare."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return unknown_fields(data, args[0], path)
    if origin in (typing.Union, types.UnionType):
        candidates = [arg for arg in args if arg is not type(None)]
        results = [unknown_fields(data, arg, path) for arg in candidates]
        return min(results, key=len) if results else []
    if origin is list and isinstance(data, list):
        return [p for i, item in enumerate(data) for p in unknown_fields(item, args[0], f"{path}[{i}]")]
    if origin is dict and isinstance(data, dict):
        return [p for key, value in data.items() for p in unknown_fields(value, args[1], f"{path}.{key}")]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel) and isinstance(data, dict):
        fields = annotation.model_fields
        if set(fields) == {"root"}:  # a RootModel wraps one value
            return unknown_fields(data, fields["root"].annotation, path)
        declared = {field.alias or name: field.annotation for name, field in fields.items()}
        out = []
        for key, value in data.items():
            if key in declared:
                out += unknown_fields(value, declared[key], f"{path}.{key}")
            else:
                out.append(f"{path}.{key}")
        return out
    return []


def validate_strict(model: type[BaseModel], document: dict[str, Any]) -> BaseModel:
    """The parsed resource; raises pydantic's ValidationError on a wrong type or a missing required field and
    AssertionError on a field the schema does not declare."""
    parsed = model.model_validate(document)
    extra = unknown_fields(document, model)
    assert not extra, f"{document.get('kind')}: fields its schema does not declare: {', '.join(extra)}"
    return parsed
