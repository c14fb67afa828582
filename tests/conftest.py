from __future__ import annotations

import os
from pathlib import Path

import pytest

from glassbox.service.model.default import default_model_dir
from tests.gpu_gate import pytest_runtest_makereport, pytest_sessionstart
from tests.helpers import make_tiny_model_dir

__all__ = ["pytest_runtest_makereport", "pytest_sessionstart"]  # hooks, found by name: GPU hosts test the GPU


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The built-in model. `make test` builds it first and sets GLASSBOX_REQUIRE_DEFAULT_MODEL=1, so in CI
    its absence is a failure; a developer running pytest by hand without it gets a skip that says why."""
    path = default_model_dir()
    if not (path / "model.safetensors").is_file():
        message = f"default model not built at {path}: run `make model`"
        if os.environ.get("GLASSBOX_REQUIRE_DEFAULT_MODEL") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path
