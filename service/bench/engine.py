"""`glassbox bench engine`: offline engine throughput, batch latency per bucket, and accuracy.

The mix is the model's own held-out snippets (heldout.jsonl, written by `glassbox model build`) or
`--texts FILE`. Texts are tokenized once up front: this measures the engine, not the tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from glassbox.service.bench.measure import (
    Passes,
    Runner,
    Variant,
    interleave,
    machine,
    paired_speedup,
    summarize,
    warm_up,
)
from glassbox.service.bench.mix import TextMix, make_batches, read_mix, synthetic_mix
from glassbox.service.engines.base import Engine, configure_torch
from glassbox.service.engines.factory import bucket_table, build_engine, choose_cpu_precision, choose_device
from glassbox.service.errors import GlassboxError, InvalidRequestError
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.files import HELDOUT_FILE
from glassbox.service.model.loader import LoadedModel, load_model
from glassbox.service.settings import Settings, load_settings
from glassbox.service.types import FloatArray, TokenBatch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the built-in model)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--quantize", choices=("none", "int8"), default="none", help="CPU only")
    parser.add_argument("--dtype", "--cpu-dtype", dest="dtype", choices=("auto", "fp32", "bf16"), default="auto",
                        help="CPU number format, as `glassbox serve --cpu-dtype` (auto: what the server would pick)")
    parser.add_argument("--compare", action="store_true",
                        help="run CPU fp32, bf16 and int8 in alternating rounds; report each one's speed ratio, answer "
                             "agreement and accuracy delta against fp32")
    parser.add_argument("--texts", type=Path, default=None,
                        help='JSON lines {"text", "label"} or plain lines (default: the model\'s heldout.jsonl)')
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sort", action=argparse.BooleanOptionalAction, default=True,
                        help="length-sort texts before cutting batches (--no-sort: file order)")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes over the mix (per variant)")
    parser.add_argument("--max-length", type=int, default=256, help="truncation length (capped by the model)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


# --compare's variants: (quantize, cpu dtype), the baseline first.
COMPARED = (("none", "fp32"), ("none", "bf16"), ("int8", "auto"))


def _settings(args: argparse.Namespace, quantize: str, dtype: str) -> Settings:
    """The engine's settings from the flags (and any GLASSBOX_* variables); settings that do not validate
    (--max-length 0, --threads -2) are a usage error, not a ValueError traceback."""
    try:
        return load_settings({
            "device": args.device, "quantize": quantize, "cpu_dtype": dtype, "threads": args.threads,
            "max_length": args.max_length, "max_batch_size": max(args.batch_size, 32),
        })
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None


def _runner(engine: Engine) -> Runner:
    def run(batch: TokenBatch) -> FloatArray:
        return engine.run(batch).logits
    return run


def _mix(args: argparse.Namespace, loaded: LoadedModel) -> TextMix:
    """--texts FILE; else the model's held-out snippets (`glassbox model build` writes them); else, for a model
    brought from elsewhere, a synthetic unlabelled mix (speed only: no accuracy without labels)."""
    if args.texts is not None:
        if not args.texts.is_file():
            # a directory exists: saying it does not sends the user looking for the wrong mistake
            problem = "is not a file" if args.texts.exists() else "does not exist"
            raise InvalidRequestError(f"{args.texts} {problem}: --texts takes a file of JSON lines or plain lines")
        return read_mix(args.texts, loaded.labels)
    heldout = loaded.path / HELDOUT_FILE
    if heldout.is_file():
        return read_mix(heldout, loaded.labels)
    print(f"glassbox bench engine: no {heldout}; timing a synthetic mix (pass --texts FILE for your own texts)",
          file=sys.stderr)
    return synthetic_mix()


def bench(args: argparse.Namespace) -> dict[str, Any]:
    if args.repeat < 1 or args.batch_size < 1:
        raise InvalidRequestError("--repeat and --batch-size must be at least 1")
    if args.device == "cuda" and (args.compare or args.quantize == "int8" or args.dtype != "auto"):
        raise InvalidRequestError("int8, --dtype and --compare are for the CPU engine (--cuda-dtype is the server's "
                                  "GPU setting)")
    if args.compare and (args.quantize != "none" or args.dtype != "auto"):
        raise InvalidRequestError("--compare runs fp32, bf16 and int8 itself: leave --quantize and --dtype out")
    chosen = COMPARED if args.compare else ((args.quantize, args.dtype),)
    settings = [_settings(args, q, d) for q, d in chosen]  # before the model loads: a flag error is at once
    loaded = load_model((args.model or default_model_dir()).expanduser())
    configure_torch(settings[0].threads, settings[0].seed)
    device = choose_device(args.device).device
    tokenizer = loaded.text_tokenizer(settings[0].max_length)
    mix = _mix(args, loaded)
    batches = make_batches(tokenizer, mix, args.batch_size, args.sort)
    choices = [choose_cpu_precision(loaded, s, tokenizer.max_length) if device == "cpu" else None for s in settings]
    engines = [build_engine(loaded, s, device, tokenizer.max_length, c) for s, c in zip(settings, choices, strict=True)]
    variants = []
    for engine in engines:
        engine.warmup()
        variant = Variant(engine.kind, _runner(engine))
        # Every batch once, untimed: bf16's oneDNN kernels are made per shape on first use, and a pass that met them
        # cold ran at 0.7x of the next ones (docs/benchmarks/2026-12-07-bf16.md).
        warm_up(variant.run, batches, count=len(batches.batches))
        variants.append(variant)
    load = busy_warning()  # just before timing: a usage error says only what is wrong
    passes = interleave(variants, batches, args.repeat)
    table = bucket_table(settings[0], tokenizer.max_length)
    summaries = {name: summarize(p, batches, table, mix.labels) for name, p in passes.items()}
    report: dict[str, Any] = {
        "load_average": round(load, 2),
        "model": str(loaded.path),
        "device": device,
        "mix": {"source": mix.source, "texts": len(mix.texts), "batch_size": args.batch_size, "sorted": args.sort,
                "max_length": tokenizer.max_length, "labelled": mix.labels is not None},
        "repeat": args.repeat,
        "machine": machine(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if not args.compare:
        if choices[0] is not None:
            report["cpu_precision"] = {"precision": choices[0].precision, "reason": choices[0].reason}
        return {**report, "engine": variants[0].name, **summaries[variants[0].name]}
    baseline, *candidates = (v.name for v in variants)
    report["variants"] = summaries
    report["comparisons"] = [_comparison(baseline, name, passes, summaries) for name in candidates]
    return report


def busy_warning() -> float:
    """The 1-minute load average, with a warning on stderr when other work already keeps the cores busy: the figures
    then measure the neighbours as much as the engine."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    cores = os.cpu_count() or 1
    if load > 0.5 * cores:
        print(f"glassbox bench engine: the load average is {load:.1f} on {cores} cores before the run: other work is "
              "running, so speeds and ratios will be noisy", file=sys.stderr)
    return load


def _comparison(baseline: str, candidate: str, passes: dict[str, Passes],
                summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    delta = None
    if summaries[baseline]["accuracy"] is not None:
        delta = round(summaries[candidate]["accuracy"] - summaries[baseline]["accuracy"], 4)
    agreement = float((passes[candidate].predictions == passes[baseline].predictions).mean())
    speedup = paired_speedup(passes[baseline], passes[candidate])
    return {"baseline": baseline, "candidate": candidate, "speedup": speedup, "accuracy_delta": delta,
            "agreement": round(agreement, 4)}


def _lines(name: str, summary: dict[str, Any]) -> list[str]:
    latency = summary["latency_ms"]
    accuracy = "n/a" if summary["accuracy"] is None else f"{summary['accuracy']:.4f}"
    lines = [f"{name}: {summary['throughput_seq_per_s']:.1f} seq/s (passes {summary['throughput_per_pass']}), "
             f"batch p50 {latency['p50']:.1f} ms, p99 {latency['p99']:.1f} ms, accuracy {accuracy}"]
    lines += [f"  bucket {key:>7}: {b['batches']:4d} batches, p50 {b['p50_ms']:8.2f} ms, p99 {b['p99_ms']:8.2f} ms, "
              f"{b['seq_per_s']:8.1f} seq/s" for key, b in summary["buckets"].items()]
    return lines


def _human(report: dict[str, Any]) -> str:
    mix = report["mix"]
    head = [f"{report['model']} on {report['device']} ({report['machine']['cpu']}, torch {report['machine']['torch']})",
            f"{mix['texts']} texts from {mix['source']}, batches of {mix['batch_size']}, "
            f"{'length-sorted' if mix['sorted'] else 'file order'}, {report['repeat']} timed passes"]
    if "variants" not in report:
        chosen = [f"CPU number format {c['precision']}: {c['reason']}" for c in [report.get("cpu_precision")] if c]
        return "\n".join(head + chosen + _lines(report["engine"], report))
    body = [line for name, summary in report["variants"].items() for line in _lines(name, summary)]
    body += [f"{c['candidate']} vs {c['baseline']}: {c['speedup']:.2f}x (median of per-round ratios), answers agree "
             f"on {c['agreement']:.4f}, accuracy delta {c['accuracy_delta']}" for c in report["comparisons"]]
    return "\n".join(head + body)


def run(args: argparse.Namespace) -> int:
    try:
        report = bench(args)
    except InvalidRequestError as exc:  # flags that do not add up: a usage error, exit 2 as argparse and bench give
        print(f"glassbox bench engine: {exc.message}", file=sys.stderr)
        return 2
    except (GlassboxError, OSError) as exc:
        print(f"glassbox bench engine: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else _human(report))
    return 0
