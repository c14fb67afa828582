"""The CPU engine's number format: the CPU's flags, the held-out gate, one choice for the engine and its fallback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from glassbox.service.engines import precision
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.engines.factory import build_engine, choose_cpu_precision, with_cpu_fallback
from glassbox.service.engines.fallback import FallbackEngine
from glassbox.service.engines.precision import (
    MAX_ACCURACY_LOSS,
    MIN_AGREEMENT,
    Agreement,
    answers_agree,
    choose_precision,
    cpu_flags,
    gate_sample,
    native_bf16,
)
from glassbox.service.model.files import HELDOUT_FILE
from glassbox.service.model.loader import LoadedModel, load_model
from glassbox.service.observer import NullObserver
from glassbox.service.settings import Settings, load_settings
from glassbox.service.types import EngineHealth, EngineResult, EngineTiming, TokenBatch, WarmupReport, engine_dtype
from tests.helpers import with_heldout_file

AMX = frozenset({"avx2", "avx512f", "amx_tile", "amx_bf16", "amx_int8"})
AVX512_BF16 = frozenset({"avx2", "avx512f", "avx512_bf16"})
AVX2_ONLY = frozenset({"avx2", "fma"})


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(tiny_model_dir)


@pytest.fixture
def with_heldout(tiny_model_dir: Path, tmp_path: Path) -> LoadedModel:
    """The tiny model with a labelled heldout.jsonl of 40 texts beside it."""
    return load_model(with_heldout_file(tiny_model_dir, tmp_path / "model", 40))


class FixedLogits:
    """An engine whose answer for each text is decided up front: the gate's arithmetic without a model's noise.
    Rows are told apart by their first real token after [CLS], which the test's texts make unique."""

    def __init__(self, by_token: dict[int, np.ndarray]) -> None:
        self.by_token = by_token

    device = "cpu"
    kind = "fixed"

    def warmup(self) -> WarmupReport:
        return WarmupReport("cpu", "fixed", (), 0.0)

    def run(self, batch: TokenBatch) -> EngineResult:
        logits = np.stack([self.by_token[int(row[1])] for row in batch.ids]).astype(np.float32)
        return EngineResult(logits, EngineTiming(0, 0, "cpu", "eager", batch.size, 0, 0, None))

    def health(self) -> EngineHealth:
        return EngineHealth(True, "cpu", "fixed")


def test_cpu_flags_reads_the_first_processors_flags(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 amx_bf16\n\n"
                    "processor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(info) == {"fpu", "avx2", "amx_bf16"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch was built without oneDNN")
def test_native_bf16_needs_amx_or_avx512_bf16() -> None:
    assert native_bf16(AMX) == "amx_bf16"
    assert native_bf16(AVX512_BF16) == "avx512_bf16"
    assert native_bf16(AVX2_ONLY) is None


@pytest.mark.parametrize("problem, fp32, bf16, expected", [
    ("single_label_classification", [[1.0, 2.0], [3.0, 0.0]], [[1.1, 2.0], [1.0, 2.0]], [True, False]),
    ("multi_label_classification", [[0.5, -0.5], [0.1, 0.2]], [[0.4, -0.6], [-0.1, 0.2]], [True, False]),
    # regression: within 1% of the fp32 outputs' spread (standard deviation 2 here: 0.02)
    ("regression", [[0.0], [4.0]], [[0.01], [4.1]], [True, False]),
])
def test_answers_agree_per_head(problem: str, fp32: list[list[float]], bf16: list[list[float]],
                                expected: list[bool]) -> None:
    got = answers_agree(problem, np.array(fp32, np.float32), np.array(bf16, np.float32))  # type: ignore[arg-type]
    assert got.tolist() == expected


@pytest.mark.parametrize("agreement, fp32, bf16, passes", [
    (1.0, 0.80, 0.80, True),
    (MIN_AGREEMENT, 0.80, 0.80 - MAX_ACCURACY_LOSS, True),
    (0.99, 0.80, 0.80, False),  # too many answers changed
    (1.0, 0.80, 0.79, False),  # accuracy fell by more than the gate allows
    (1.0, None, None, True),  # an unlabelled sample: agreement alone
])
def test_the_gate(agreement: float, fp32: float | None, bf16: float | None, passes: bool) -> None:
    assert Agreement(512, agreement, 0.01, fp32, bf16).passes is passes


def test_explicit_choices_need_no_gate(loaded: LoadedModel) -> None:
    def never(_: str) -> EagerEngine:
        raise AssertionError("no engine is built for an explicit choice")

    assert choose_precision("auto", "int8", loaded, never, 64, flags=AMX).precision == "int8"
    assert choose_precision("fp32", "none", loaded, never, 64, flags=AMX).precision == "fp32"
    asked = choose_precision("bf16", "none", loaded, never, 64, flags=AVX2_ONLY)
    assert asked.precision == "bf16" and "no native bf16" in asked.reason and "slower" in asked.reason
    assert "slower" not in choose_precision("bf16", "none", loaded, never, 64, flags=AMX).reason


def test_auto_stays_fp32_without_native_bf16_or_without_a_sample(loaded: LoadedModel,
                                                                 with_heldout: LoadedModel) -> None:
    def never(_: str) -> EagerEngine:
        raise AssertionError("no gate runs")

    no_native = choose_precision("auto", "none", with_heldout, never, 64, flags=AVX2_ONLY)
    assert no_native.precision == "fp32" and "no native bf16" in no_native.reason
    if torch.backends.mkldnn.is_available():
        no_sample = choose_precision("auto", "none", loaded, never, 64, flags=AMX)
        assert no_sample.precision == "fp32" and HELDOUT_FILE in no_sample.reason and "amx_bf16" in no_sample.reason


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch was built without oneDNN")
@pytest.mark.parametrize("content, problem", [
    ('{"text": "fine", "label": 0}\n{"text": broken\n', "is not valid JSON"),
    ('{"text": "fine", "label": "no-such-label"}\n', "is not one of the model's labels"),
    ("", "holds no texts"),
])
def test_a_held_out_file_that_cannot_be_read_leaves_fp32_and_says_why(with_heldout: LoadedModel, content: str,
                                                                      problem: str) -> None:
    (with_heldout.path / HELDOUT_FILE).write_text(content)

    def never(_: str) -> EagerEngine:
        raise AssertionError("no gate runs on a file that cannot be read")

    choice = choose_precision("auto", "none", with_heldout, never, 64, flags=AMX)
    assert choice.precision == "fp32" and "cannot be read" in choice.reason and problem in choice.reason


def test_gate_sample_spreads_over_the_file_with_its_labels(with_heldout: LoadedModel) -> None:
    sample = gate_sample(with_heldout, limit=10)
    assert sample is not None
    texts, labels = sample
    lines = [json.loads(line) for line in (with_heldout.path / HELDOUT_FILE).read_text().splitlines()]
    assert len(texts) == 10 and texts[0] == lines[0]["text"] and texts[-1] == lines[-1]["text"]
    assert labels is not None and labels.tolist() == [lines[[x["text"] for x in lines].index(t)]["label"]
                                                      for t in texts]


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch was built without oneDNN")
@pytest.mark.parametrize("flipped, expected", [(0, "bf16"), (3, "fp32")])
def test_auto_runs_the_gate_on_the_held_out_sample(with_heldout: LoadedModel, flipped: int, expected: str) -> None:
    """Engines with answers fixed per text: none changed, bf16 is kept; 3 of 40 changed (0.925 agreement), fp32."""
    sample = gate_sample(with_heldout)
    assert sample is not None
    tokenizer = with_heldout.text_tokenizer(64)
    firsts = [int(tokenizer.encode([text]).ids[0, 1]) for text in sample[0]]
    base = {token: np.eye(3, dtype=np.float32)[token % 3] for token in firsts}
    low = dict(base)
    for token in list(dict.fromkeys(firsts))[:flipped]:
        low[token] = np.roll(base[token], 1)
    engines = {"fp32": FixedLogits(base), "bf16": FixedLogits(low)}
    built: list[str] = []

    def make(name: str) -> FixedLogits:
        built.append(name)
        return engines[name]

    choice = choose_precision("auto", "none", with_heldout, make, 64, flags=AMX)  # type: ignore[arg-type]
    assert built == ["fp32", "bf16"]
    assert choice.precision == expected and choice.agreement is not None
    assert choice.agreement.texts == len(sample[0])
    changed = sum(firsts.count(token) for token in list(dict.fromkeys(firsts))[:flipped])
    assert choice.agreement.agreement == pytest.approx(1 - changed / len(firsts))
    assert ("failed the accuracy gate" in choice.reason) == (expected == "fp32")
    assert "accuracy 0." in choice.reason and "not checked" not in choice.reason


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch was built without oneDNN")
def test_a_file_with_an_unlabelled_line_is_checked_for_agreement_only_and_the_line_says_so(
        with_heldout: LoadedModel) -> None:
    path = with_heldout.path / HELDOUT_FILE
    path.write_text(path.read_text() + "a plain line, no label\n")
    engines = {name: EagerEngine(with_heldout.model, "cpu", name, executor="python") for name in ("fp32", "bf16")}
    choice = choose_precision("auto", "none", with_heldout, engines.__getitem__, 64, flags=AMX)  # type: ignore[arg-type]
    assert choice.agreement is not None and choice.agreement.accuracy_delta is None
    assert "accuracy not checked (a line of the file has no label: answers compared only)" in choice.reason


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch was built without oneDNN")
def test_a_bf16_engine_that_fails_on_the_sample_leaves_fp32(with_heldout: LoadedModel) -> None:
    class Broken(FixedLogits):
        def run(self, batch: TokenBatch) -> EngineResult:
            raise RuntimeError("no bf16 kernel for this op")

    engines = {"fp32": EagerEngine(with_heldout.model, "cpu", executor="python"), "bf16": Broken({})}
    choice = choose_precision("auto", "none", with_heldout, engines.__getitem__, 64, flags=AMX)  # type: ignore[arg-type]
    assert choice.precision == "fp32" and "RuntimeError: no bf16 kernel for this op" in choice.reason


def test_one_choice_for_the_cpu_engine_and_the_fallback(loaded: LoadedModel) -> None:
    settings = Settings(cpu_dtype="bf16", cpu_executor="python")
    chosen = choose_cpu_precision(loaded, settings, 64)
    engine = build_engine(loaded, settings, "cpu", 64, chosen)
    assert engine.kind == "eager-bf16"
    wrapped = with_cpu_fallback(engine, loaded, settings, NullObserver(), on_cpu=True, precision=chosen)
    assert isinstance(wrapped, FallbackEngine) and wrapped.secondary.kind == "eager-bf16"
    assert engine_dtype(wrapped.kind, "cpu") == "bf16"


def test_the_bf16_engine_keeps_the_head_in_fp32_and_the_loaded_model_untouched(loaded: LoadedModel) -> None:
    engine = EagerEngine(loaded.model, "cpu", "bf16", executor="python")
    module = engine.model
    assert module.layers[0].qkv.weight.dtype == torch.bfloat16  # type: ignore[index,union-attr]
    assert module.pooler.weight.dtype == module.classifier.weight.dtype == torch.float32  # type: ignore[union-attr]
    assert all(p.dtype == torch.float32 for p in loaded.model.parameters())
    batch = loaded.text_tokenizer(64).encode(["a good film", "the worst film and a boring plot " * 3])
    logits = engine.run(batch).logits
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, EagerEngine(loaded.model, "cpu").run(batch).logits, atol=1e-2, rtol=0)


@pytest.mark.parametrize("overrides, message", [
    ({"quantize": "int8", "cpu_dtype": "bf16"}, "quantize int8 and cpu_dtype bf16 exclude each other"),
    ({"cpu_executor": "aoti", "cpu_dtype": "bf16"}, "cpu_executor aoti compiles fp32 models only"),
])
def test_settings_that_exclude_each_other(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_settings(overrides, environ={})


def test_aoti_keeps_auto_at_fp32_without_compiling_twice(loaded: LoadedModel) -> None:
    choice = choose_cpu_precision(loaded, Settings(cpu_executor="aoti"), 64)
    assert choice.precision == "fp32" and "aoti" in choice.reason


@pytest.mark.parametrize("kind, device, dtype", [
    ("eager-bf16", "cpu", "bf16"),
    ("eager-int8", "cpu", "int8"),
    ("fallback(graph-fp16, eager-bf16)", "cuda:0", "fp16"),
    ("fallback(graph-fp16, eager-bf16)", "cpu", "bf16"),  # degraded: the CPU computes
    ("fallback(chaos(eager-fp32), eager-fp32)", "cpu", "fp32"),
    ("graph-rehearsal-bf16", "cuda:0", "bf16"),
    ("null", "cpu", ""),
    ("pending(CUDA graphs on 35 buckets)", "cuda:0", ""),
])
def test_engine_dtype_reads_the_kind(kind: str, device: str, dtype: str) -> None:
    assert engine_dtype(kind, device) == dtype


@pytest.mark.default_model
def test_the_default_model_passes_its_own_gate(default_model_path: Path) -> None:
    """On any CPU: the flags are the AMX host's, so the gate runs; without native bf16 torch computes bf16 by
    conversion, the same numbers, slower."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch was built without oneDNN")
    loaded = load_model(default_model_path)
    settings = Settings()
    choice = choose_precision("auto", "none", loaded, lambda p: precision_engine(loaded, settings, p), 256, flags=AMX)
    assert choice.agreement is not None and choice.agreement.texts == precision.GATE_TEXTS
    assert choice.precision == "bf16", choice.reason


def precision_engine(loaded: LoadedModel, settings: Settings, name: str) -> EagerEngine:
    from glassbox.service.engines.factory import cpu_engine

    return cpu_engine(loaded, settings, name)  # type: ignore[arg-type]
