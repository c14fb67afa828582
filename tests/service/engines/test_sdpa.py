"""The SDPA backend probe: torch's internal choice function is still there and answers; without it, "unknown"."""

from __future__ import annotations

import pytest
import torch

from glassbox.service.engines import sdpa

KNOWN = {"math", "flash_attention", "efficient_attention", "cudnn_attention", "overrideable"}


def test_torch_still_has_the_dispatchers_choice_function() -> None:
    # The one internal this probe uses (see the module docstring); if a torch upgrade drops it, this fails first.
    assert callable(getattr(torch, "_fused_sdp_choice", None))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_probe_names_a_real_backend_on_this_device(dtype: torch.dtype) -> None:
    name = sdpa.sdpa_backend(heads=4, length=16, head_dim=8, dtype=dtype, device=torch.device("cpu"))
    assert name in KNOWN


def test_without_the_internal_the_answer_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch, "_fused_sdp_choice")
    assert sdpa.sdpa_backend(4, 16, 8, torch.float32, torch.device("cpu")) == sdpa.UNKNOWN


def test_a_failing_internal_costs_a_word_not_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> int:
        raise RuntimeError("signature changed")

    monkeypatch.setattr(torch, "_fused_sdp_choice", broken)
    assert sdpa.sdpa_backend(4, 16, 8, torch.float32, torch.device("cpu")) == sdpa.UNKNOWN


def test_one_name_when_every_length_agrees_else_each_length(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sdpa, "sdpa_backend", lambda heads, length, *rest: "math")
    assert sdpa.sdpa_backends(4, [64, 16, 16], 8, torch.float16, torch.device("cpu")) == "math"
    monkeypatch.setattr(sdpa, "sdpa_backend",
                        lambda heads, length, *rest: "math" if length < 64 else "efficient_attention")
    assert sdpa.sdpa_backends(4, [128, 16], 8, torch.float16, torch.device("cpu")) == \
        "16:math, 128:efficient_attention"
