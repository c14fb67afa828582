"""Which number format the CPU engine computes in: fp32, bf16 or int8, chosen once at start-up and said in one line.

Why bf16: CPUs with AMX (Intel Xeon 4th generation and later) or AVX512-BF16 multiply bf16 matrices in hardware.
Measured on an Intel Xeon with AMX, 2 threads, glassbox's own engine (docs/benchmarks/2026-12-07-bf16.md): 3.7x
fp32 for a BERT-base sized model at batch 8 x 32 tokens, 2.0-2.5x for the built-in model on its held-out mix, with
the same held-out accuracy. Without native support torch still computes bf16, by conversion, slower than fp32:
`auto` never picks it there.

Why a gate: bf16 keeps 8 bits of mantissa, so logits move (by up to 0.034 on the built-in model) and a text near
the decision boundary can change its answer. `auto` runs the model's own held-out sample (`heldout.jsonl` in the
model directory: `glassbox model build` writes one; any model can carry one) through both engines and keeps bf16
only when the answers agree on at least 99.5% of the texts and the accuracy (where the sample is labelled) falls
by at most 0.005. A model with no sample stays fp32: nothing would show that bf16 answers as fp32 does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from glassbox.service.engines.base import Engine
from glassbox.service.errors import GlassboxError
from glassbox.service.model.files import HELDOUT_FILE
from glassbox.service.model.loader import LoadedModel
from glassbox.service.types import FloatArray, IntArray, ProblemType

log = logging.getLogger("glassbox.engine")

CpuPrecision = Literal["fp32", "bf16", "int8"]
# The CPU features that multiply bf16 natively, best first, as /proc/cpuinfo names them.
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
MIN_AGREEMENT = 0.995  # share of held-out texts whose answer bf16 must leave as fp32 gives it
MAX_ACCURACY_LOSS = 0.005  # held-out accuracy bf16 may lose against fp32
GATE_TEXTS = 512  # held-out texts the gate runs (~3 s of start-up on 2 cores for the built-in model)
GATE_BATCH = 32


@dataclass(frozen=True, slots=True)
class Agreement:
    """How bf16 answered a sample against fp32."""

    texts: int
    agreement: float  # share of texts with the same answer (label, label set, or value within tolerance)
    max_logit_difference: float
    accuracy_fp32: float | None  # None: the sample carries no labels
    accuracy_bf16: float | None
    unchecked: str = ""  # why accuracy was not compared (no labels on some line, a head without one right answer)

    @property
    def accuracy_delta(self) -> float | None:
        if self.accuracy_fp32 is None or self.accuracy_bf16 is None:
            return None
        return self.accuracy_bf16 - self.accuracy_fp32

    @property
    def passes(self) -> bool:
        delta = self.accuracy_delta
        # (1e-9: shares are ratios of counts, and 0.795 - 0.8 is a hair below -0.005 in floating point)
        return self.agreement >= MIN_AGREEMENT - 1e-9 and (delta is None or delta >= -MAX_ACCURACY_LOSS - 1e-9)

    def describe(self) -> str:
        accuracy = f", accuracy not checked ({self.unchecked})" if self.unchecked else ""
        if self.accuracy_fp32 is not None and self.accuracy_bf16 is not None:
            accuracy = f", accuracy {self.accuracy_fp32:.4f} -> {self.accuracy_bf16:.4f}"
        return (f"answers agree on {self.agreement:.4f} of {self.texts} held-out texts (gate {MIN_AGREEMENT}){accuracy}"
                f", largest logit difference {self.max_logit_difference:.4f}")


@dataclass(frozen=True, slots=True)
class PrecisionChoice:
    precision: CpuPrecision
    reason: str  # one sentence for the start-up log
    agreement: Agreement | None = None


def cpu_flags(path: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (the first processor's); empty where there is no /proc/cpuinfo."""
    try:
        with path.open(encoding="ascii", errors="replace") as lines:
            for line in lines:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def native_bf16(flags: frozenset[str]) -> str | None:
    """The flag that makes bf16 fast on this CPU, or None. torch runs bf16 matrix products through oneDNN, which
    uses AMX tiles or AVX512-BF16 instructions when the CPU has them."""
    import torch

    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return None
    return next((flag for flag in NATIVE_BF16_FLAGS if flag in flags), None)


def answers_agree(problem: ProblemType, fp32: FloatArray, bf16: FloatArray) -> np.ndarray:
    """[n] bool: whether each text gets the same answer. Single-label: the same top label; multi-label: the same set
    of labels over the 0.5 threshold (logit 0); regression: within 1% of the fp32 outputs' spread."""
    if problem == "multi_label_classification":
        agree: np.ndarray = ((fp32 > 0) == (bf16 > 0)).all(axis=1)
        return agree
    if problem == "regression":
        scale = float(fp32.std()) or 1.0
        close: np.ndarray = (np.abs(fp32 - bf16) <= 0.01 * scale).all(axis=1)
        return close
    same: np.ndarray = fp32.argmax(axis=1) == bf16.argmax(axis=1)
    return same


def compare(fp32: Engine, bf16: Engine, loaded: LoadedModel, texts: tuple[str, ...], labels: IntArray | None,
            max_length: int) -> Agreement:
    """Run `texts` through both engines (length-sorted batches, as the batcher forms them) and compare answers."""
    from glassbox.service.bench.mix import TextMix, make_batches  # read only when a gate runs

    tokenizer = loaded.text_tokenizer(max_length)
    batches = make_batches(tokenizer, TextMix(texts, labels, "gate"), GATE_BATCH, sort=True)
    outputs = []
    for engine in (fp32, bf16):
        logits = np.zeros((len(texts), loaded.config.num_labels), dtype=np.float32)
        for batch, rows in zip(batches.batches, batches.rows, strict=True):
            logits[rows] = engine.run(batch).logits
        outputs.append(logits)
    base, low = outputs
    problem = loaded.config.problem_type
    accuracy: list[float | None] = [None, None]
    unchecked = ""
    if labels is None:
        unchecked = "a line of the file has no label: answers compared only"
    elif problem != "single_label_classification":
        unchecked = "the head gives no single label to score: answers compared only"
    else:
        accuracy = [float((out.argmax(axis=1) == labels).mean()) for out in outputs]
    return Agreement(texts=len(texts), agreement=float(answers_agree(problem, base, low).mean()),
                     max_logit_difference=float(np.abs(base - low).max()) if len(texts) else 0.0,
                     accuracy_fp32=accuracy[0], accuracy_bf16=accuracy[1], unchecked=unchecked)


def gate_sample(loaded: LoadedModel, limit: int = GATE_TEXTS) -> tuple[tuple[str, ...], IntArray | None] | None:
    """Up to `limit` texts of the model's held-out file, spread evenly over it, with their labels; None without one."""
    from glassbox.service.bench.mix import read_mix

    path = loaded.path / HELDOUT_FILE
    if not path.is_file():
        return None
    mix = read_mix(path, loaded.labels)
    picks = np.linspace(0, len(mix.texts) - 1, num=min(limit, len(mix.texts))).round().astype(np.int64)
    picks = np.unique(picks)
    labels = None if mix.labels is None else mix.labels[picks]
    return tuple(mix.texts[int(i)] for i in picks), labels


EngineMaker = Callable[[CpuPrecision], Engine]


def choose_precision(requested: str, quantize: str, loaded: LoadedModel, make: EngineMaker, max_length: int, *,
                     flags: frozenset[str] | None = None) -> PrecisionChoice:
    """The CPU engine's number format for `--cpu-dtype requested` (auto, fp32 or bf16) and `--quantize`. `make` builds
    a CPU engine in a given precision (for the gate); `flags` stands in for the CPU's in tests."""
    if quantize == "int8":
        return PrecisionChoice("int8", "--quantize int8 was asked for")
    if requested == "fp32":
        return PrecisionChoice("fp32", "--cpu-dtype fp32 was asked for")
    native = native_bf16(cpu_flags() if flags is None else flags)
    if requested == "bf16":
        slow = "" if native else " (this CPU has no native bf16, amx_bf16 or avx512_bf16: expect it slower than fp32)"
        return PrecisionChoice("bf16", f"--cpu-dtype bf16 was asked for{slow}")
    if native is None:
        return PrecisionChoice("fp32", "auto: this CPU has no native bf16 (neither amx_bf16 nor avx512_bf16)")
    try:
        sample = gate_sample(loaded)
    except GlassboxError as error:  # a file the server only reads for the gate must not keep it from serving
        return PrecisionChoice("fp32", f"auto: the CPU has {native}, but {HELDOUT_FILE} cannot be read to check bf16 "
                                       f"against fp32: {error.message}")
    if sample is None:
        return PrecisionChoice("fp32", f"auto: the CPU has {native}, but the model directory has no {HELDOUT_FILE} "
                                       "to check bf16's answers against fp32's (docs/models.md, 'CPU number formats')")
    start = time.perf_counter()
    try:
        agreement = compare(make("fp32"), make("bf16"), loaded, *sample, max_length)
    except Exception as exc:  # a torch without bf16 kernels for some op: fp32 serves, and the line says why
        log.warning("the bf16 gate failed to run", exc_info=True)
        return PrecisionChoice("fp32", f"auto: the CPU has {native}, but the bf16 engine failed on the held-out "
                                       f"sample ({type(exc).__name__}: {exc})")
    took = f" ({time.perf_counter() - start:.1f} s)"
    if agreement.passes:
        return PrecisionChoice("bf16", f"auto: the CPU has {native}; bf16 {agreement.describe()}{took}", agreement)
    return PrecisionChoice("fp32", f"auto: bf16 failed the accuracy gate: {agreement.describe()}{took}", agreement)
