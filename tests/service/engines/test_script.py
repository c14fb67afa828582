from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from glassbox.service.engines.eager import EagerEngine, quantize_int8
from glassbox.service.engines.script import script_forward
from glassbox.service.model.loader import load_model
from glassbox.service.tokenizer import TextTokenizer

TEXTS = ["good", "the movie was very good but the ending was slow", "", "awful acting, boring plot and a long film"]


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_recorded_forward_equals_the_python_forward_for_other_shapes(tiny_model_dir: Path, quantize: str) -> None:
    model = load_model(tiny_model_dir).model
    module = quantize_int8(model).eval() if quantize == "int8" else model
    scripted = script_forward(module, torch.device("cpu"))
    assert scripted is not None
    generator = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for batch, seq in [(1, 1), (1, 7), (3, 2), (5, 40), (16, 128)]:  # none of them the recorded (2, 8)
            ids = torch.randint(5, 60, (batch, seq), generator=generator)
            lengths = torch.randint(1, seq + 1, (batch,), generator=generator)
            mask = torch.arange(seq)[None, :] < lengths[:, None]
            assert torch.equal(scripted(ids, mask), module(ids, mask))
            assert torch.equal(scripted(ids, None), module(ids, None))


def test_engine_executors_agree_and_report_which_ran(tiny_model_dir: Path) -> None:
    loaded = load_model(tiny_model_dir)
    batch = TextTokenizer.from_file(loaded.tokenizer_file, 64, 128).encode(TEXTS)
    recorded = EagerEngine(loaded.model, executor="torchscript")
    python = EagerEngine(loaded.model, executor="python")
    assert (recorded.executor, python.executor) == ("torchscript", "python")
    np.testing.assert_array_equal(recorded.run(batch).logits, python.run(batch).logits)


def test_an_unrecordable_module_falls_back_to_none_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    class Unrecordable(torch.nn.Module):
        def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
            raise RuntimeError("cannot be traced")

    assert script_forward(Unrecordable(), torch.device("cpu")) is None
    assert "TorchScript recording failed" in caplog.text
