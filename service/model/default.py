"""Where the built-in default model lives. It is built locally (`glassbox model build`), never downloaded."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL_NAME = "minilm-rt-sentiment"


def default_model_dir() -> Path:
    """`$GLASSBOX_DEFAULT_MODEL_DIR`, else `$XDG_CACHE_HOME/glassbox/models/minilm-rt-sentiment`."""
    explicit = os.environ.get("GLASSBOX_DEFAULT_MODEL_DIR")
    if explicit:
        return Path(explicit).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "glassbox" / "models" / DEFAULT_MODEL_NAME
