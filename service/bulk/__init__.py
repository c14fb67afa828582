"""Bulk classification: `glassbox classify` over files, and `Classifier` for Ray Data, Spark or plain Python.

`Classifier` is re-exported lazily: `glassbox classify --help` (which imports this package for its flags) must not
load torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from glassbox.service.bulk.classifier import Classifier, classify_pandas

__all__ = ["Classifier", "classify_pandas"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from glassbox.service.bulk import classifier

        return getattr(classifier, name)
    raise AttributeError(f"module 'glassbox.service.bulk' has no attribute {name!r}")
