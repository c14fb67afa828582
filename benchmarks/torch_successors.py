"""The CPU engine's deprecated torch APIs against their successors, on the same batches, interleaved.

    PYTHONPATH=<dir with torchao> .venv/bin/python -m benchmarks.torch_successors [--rounds 5] [--batch-size 32]
        [--model DIR] [--variants a,b,...] [--json OUT]

The CPU engine records its forward pass with `torch.jit.trace` (TorchScript) and quantizes with
`torch.ao.quantization.quantize_dynamic`; torch 2.13 marks both deprecated. Variants, each turning a TokenBatch into
logits exactly as `EagerEngine.run` does (ids cut to the batch's longest text, a padding mask when rows differ):

- fp32: `torchscript` (the engine today), `python` (the plain module, op by op), `compile` (`torch.compile`,
  dynamic shapes), `aoti` (`torch.export` with dynamic batch and length, compiled ahead of time by AOTInductor and
  run from its package, without the Python interpreter between ops);
- int8: `ao-int8` (the engine's `--quantize int8` today: torch.ao dynamic quantization, per-channel, recorded with
  TorchScript), `torchao-int8` (torchao's `Int8DynamicActivationInt8WeightConfig` on the same Linear layers, run
  through `torch.compile`, which is how torchao gets its speed on the CPU).

Every variant runs one warm-up spread of the real batches before timing (for the compiled ones that is where
compilation for the shapes happens; the build and first-call seconds are reported apart as `prepare_s`). Timed
passes are interleaved round by round (glassbox.service.bench.measure); speed ratios are the median of per-round ratios
against `torchscript` (fp32) and `ao-int8` (int8); accuracy is on the model's held-out labels.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from glassbox.service.bench.measure import Variant, emit, interleave, machine, paired_speedup, summarize, warm_up
from glassbox.service.bench.mix import make_batches, read_mix
from glassbox.service.engines.base import attention_mask, configure_torch
from glassbox.service.engines.eager import EagerEngine, _int8_plan
from glassbox.service.engines.factory import bucket_table
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.files import HELDOUT_FILE
from glassbox.service.model.loader import load_model
from glassbox.service.settings import load_settings
from glassbox.service.types import FloatArray, TokenBatch

Forward = Callable[[Tensor, Tensor], Tensor]  # (ids [n, width], mask [n, width] bool) -> logits [n, labels]
FP32 = ("torchscript", "python", "compile", "aoti")
INT8 = ("ao-int8", "torchao-int8")


def runner(forward: Forward) -> Callable[[TokenBatch], FloatArray]:
    """EagerEngine.run's tensor handling around any forward pass; a batch without padding gets an all-true mask,
    so every variant runs the same ops."""

    def run(batch: TokenBatch) -> FloatArray:
        width = batch.max_length
        ids = torch.from_numpy(batch.ids[:, :width])  # [n, width]
        mask_np = attention_mask(batch.lengths, width)
        mask = torch.ones(ids.shape, dtype=torch.bool) if mask_np is None else torch.from_numpy(mask_np)
        with torch.inference_mode():
            out: FloatArray = forward(ids, mask).float().numpy()  # [n, labels]
        return out

    return run


def engine_runner(engine: EagerEngine) -> Callable[[TokenBatch], FloatArray]:
    def run(batch: TokenBatch) -> FloatArray:
        return engine.run(batch).logits
    return run


def aoti_forward(model: nn.Module, max_length: int, workdir: Path) -> Forward:
    batch = torch.export.Dim("batch", min=1, max=256)
    seq = torch.export.Dim("seq", min=2, max=max_length)
    ids = torch.ones((4, 16), dtype=torch.int64)  # [batch, seq]
    mask = torch.ones((4, 16), dtype=torch.bool)
    mask[1, 10:] = False
    with torch.inference_mode():
        exported = torch.export.export(model, (ids, mask), dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
    package = torch._inductor.aoti_compile_and_package(exported, package_path=str(workdir / "model.pt2"))
    loaded = torch._inductor.aoti_load_package(package)

    def forward(ids: Tensor, mask: Tensor) -> Tensor:
        out: Tensor = loaded(ids, mask)
        return out

    return forward


def torchao_int8(model: nn.Module) -> nn.Module:
    """torchao's dynamic int8 (int8 weights per channel, int8 activations per token) on the Linear layers the
    engine's torch.ao plan quantizes (all of the encoder's but layer 0's feed-forward down-projection)."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    quantized = copy.deepcopy(model)
    plan = set(_int8_plan(quantized.layers))
    quantize_(quantized.layers, Int8DynamicActivationInt8WeightConfig(),
              filter_fn=lambda module, name: isinstance(module, nn.Linear) and name in plan)
    return quantized


def build(name: str, model: nn.Module, max_length: int, workdir: Path) -> Callable[[TokenBatch], FloatArray]:
    if name == "torchscript":
        return engine_runner(EagerEngine(model))
    if name == "python":
        return engine_runner(EagerEngine(model, executor="python"))
    if name == "compile":
        return runner(torch.compile(model, dynamic=True))
    if name == "aoti":
        return runner(aoti_forward(model, max_length, workdir))
    if name == "ao-int8":
        return engine_runner(EagerEngine(model, quantize="int8"))
    if name == "torchao-int8":
        return runner(torch.compile(torchao_int8(model), dynamic=True))
    raise ValueError(f"unknown variant {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--variants", default=",".join(FP32 + INT8))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    warnings.simplefilter("ignore", DeprecationWarning)
    loaded = load_model((args.model or default_model_dir()).expanduser())
    settings = load_settings({"threads": args.threads, "max_batch_size": max(args.batch_size, 32)})
    configure_torch(settings.threads, settings.seed)
    tokenizer = loaded.text_tokenizer(settings.max_length)
    mix = read_mix(loaded.path / HELDOUT_FILE, loaded.labels)
    batches = make_batches(tokenizer, mix, args.batch_size, sort=True)
    variants: list[Variant] = []
    prepare_s: dict[str, float] = {}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.variants.split(","):
            start = time.perf_counter()
            try:
                run = build(name, loaded.model, tokenizer.max_length, Path(tmp))
                warm_up(run, batches)
            except Exception as exc:  # a successor that cannot build is a finding, not a crash of the comparison
                failed[name] = f"{type(exc).__name__}: {exc}"[:600]
                traceback.print_exc(file=sys.stderr)
                continue
            prepare_s[name] = round(time.perf_counter() - start, 1)
            print(f"{name}: ready in {prepare_s[name]} s", file=sys.stderr)
            variants.append(Variant(name, run))
        passes = interleave(variants, batches, args.rounds)
    table = bucket_table(settings, tokenizer.max_length)
    summaries = {name: summarize(p, batches, table, mix.labels) for name, p in passes.items()}
    comparisons: dict[str, dict[str, Any]] = {}
    for name in passes:
        baseline = "ao-int8" if name in INT8 else "torchscript"
        if name != baseline and baseline in passes:
            delta = summaries[name]["accuracy"] - summaries[baseline]["accuracy"]
            comparisons[name] = {"baseline": baseline, "speedup": paired_speedup(passes[baseline], passes[name]),
                                 "accuracy_delta": round(delta, 4)}
    report = {
        "model": str(loaded.path),
        "mix": {"texts": len(mix.texts), "batch_size": args.batch_size, "sorted": True},
        "rounds": args.rounds,
        "machine": machine(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "prepare_s": prepare_s,
        "failed": failed,
        "variants": {name: {key: summary[key] for key in ("throughput_seq_per_s", "throughput_per_pass",
                                                           "latency_ms", "accuracy")}
                     for name, summary in summaries.items()},
        "comparison": comparisons,
    }
    emit(report, args.json)


if __name__ == "__main__":
    main()
