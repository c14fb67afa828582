"""`--cpu-executor aoti`: the forward pass exported and compiled ahead of time, the successor of the TorchScript
recording, kept behind a flag (service/engines/aoti.py says why); it must compute what the Python forward pass does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from glassbox.service.engines import aoti
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.model.loader import LoadedModel, load_model
from glassbox.service.tokenizer import TextTokenizer

TEXTS = ["good", "the movie was very good but the ending was slow", "", "awful acting, boring plot and a long film"]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(tiny_model_dir)


@pytest.fixture(scope="module")
def compiled(loaded: LoadedModel) -> EagerEngine:
    """One compilation for the module (tens of seconds on 2 cores)."""
    return EagerEngine(loaded.model, executor="aoti")


def test_the_compiled_forward_equals_the_python_forward_for_any_batch_and_length(loaded: LoadedModel,
                                                                                 compiled: EagerEngine) -> None:
    assert compiled.executor == "aoti"
    model = loaded.model
    generator = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for batch, seq in [(1, 2), (1, 7), (3, 2), (5, 40), (16, 128)]:  # none of them the exported (2, 8)
            ids = torch.randint(5, 60, (batch, seq), generator=generator)
            lengths = torch.randint(2, seq + 1, (batch,), generator=generator)
            mask = torch.arange(seq)[None, :] < lengths[:, None]
            torch.testing.assert_close(compiled._forward(ids, mask, None), model(ids, mask), atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(compiled._forward(ids, None, None), model(ids, None), atol=1e-4, rtol=1e-4)


def test_the_compiled_engine_agrees_with_the_recorded_one(loaded: LoadedModel, compiled: EagerEngine) -> None:
    batch = TextTokenizer.from_file(loaded.tokenizer_file, 64, 128).encode(TEXTS)
    recorded = EagerEngine(loaded.model, executor="torchscript")
    np.testing.assert_allclose(compiled.run(batch).logits, recorded.run(batch).logits, atol=1e-4, rtol=1e-4)
    assert compiled.warmup().kind == recorded.kind == "eager-fp32"  # the same engine, another executor


def test_int8_is_recorded_with_torchscript_instead(loaded: LoadedModel) -> None:
    assert EagerEngine(loaded.model, quantize="int8", executor="aoti").executor == "torchscript"


def test_a_failed_compilation_falls_back_to_the_recording(loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    def no_compiler(*args: object, **kwargs: object) -> str:
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", no_compiler)
    assert aoti.aoti_forward(loaded.model, 32) is None
    assert "no C++ compiler" in caplog.text
    assert EagerEngine(loaded.model, executor="aoti").executor == "torchscript"
