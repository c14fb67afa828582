"""Device choice and engine construction on a CPU machine (CUDA presence is simulated where needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from glassbox.service.engines.eager import EagerEngine
from glassbox.service.engines.factory import bucket_table, build_engine, choose_device
from glassbox.service.errors import DeviceUnavailableError
from glassbox.service.model.loader import load_model
from glassbox.service.settings import Settings
from glassbox.service.types import Bucket


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    # On a GPU machine this keeps the CPU expectations true; on the CPU it changes nothing.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.usefixtures("no_cuda")
def test_auto_falls_back_to_cpu_and_says_why() -> None:
    choice = choose_device("auto")
    assert choice.device == "cpu"
    assert choice.reason.startswith("auto: ")
    assert ("without CUDA" in choice.reason) == (torch.version.cuda is None)
    assert ("no CUDA device is visible" in choice.reason) == (torch.version.cuda is not None)


@pytest.mark.usefixtures("no_cuda")
def test_cuda_without_a_gpu_is_an_error() -> None:
    with pytest.raises(DeviceUnavailableError, match="no usable CUDA device"):
        choose_device("cuda")


@pytest.mark.usefixtures("no_cuda")
def test_cpu_is_always_granted() -> None:
    assert choose_device("cpu").device == "cpu"


def test_on_this_machine_auto_matches_torch() -> None:
    """Unpatched: whatever torch reports here, auto agrees with it and says why."""
    choice = choose_device("auto")
    assert choice.device == ("cuda:0" if torch.cuda.is_available() else "cpu")
    assert choice.reason


def test_auto_picks_a_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Fake GPU")
    choice = choose_device("auto")
    assert choice.device == "cuda:0" and "Fake GPU" in choice.reason
    assert choose_device("cuda").device == "cuda:0"
    assert choose_device("cpu").device == "cpu"  # asking for the CPU wins even with a GPU


def test_bucket_table_follows_the_settings() -> None:
    settings = Settings(max_batch_size=24, length_buckets=(16, 64, 512), batch_buckets=(1, 8, 32))
    table = bucket_table(settings, max_length=128)
    assert table.batches == (1, 8, 24)
    assert table.lengths == (16, 64, 128)
    assert table.lookup(9, 65) == Bucket(24, 128)


@pytest.mark.parametrize("quantize, kind", [("none", "eager-fp32"), ("int8", "eager-int8")])
def test_cpu_engine(tiny_model_dir: Path, quantize: str, kind: str) -> None:
    engine = build_engine(load_model(tiny_model_dir), Settings(quantize=quantize), "cpu", 128)  # type: ignore[arg-type]
    assert isinstance(engine, EagerEngine)
    assert engine.kind == kind and engine.device == "cpu"
