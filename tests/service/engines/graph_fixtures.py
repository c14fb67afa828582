"""Fixtures shared by the graph engine's test modules, imported by name (not from a conftest): the GPU check runs
those modules with --noconftest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from glassbox.service.model.bert import BertClassifier
from glassbox.service.model.loader import load_model
from tests.helpers import make_tiny_model_dir


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    # The model is tiny: with several intra-op threads on a shared 2-core machine, thread hand-off costs more
    # than the arithmetic (a warm-up went from 15 ms to 500 ms under load).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> BertClassifier:
    directory: Path = make_tiny_model_dir(tmp_path_factory.mktemp("graphs-tiny-model"))
    return load_model(directory).model
