"""glassbox's eager engine against transformers' own classifier for the directory (AutoModelForSequenceClassification),
on the same texts, in one process.

Every (batching, variant) pair gets one timed pass per round, rounds run back to back and the variant
order rotates from round to round, so a neighbour's load on a shared CPU falls on every variant alike.
Ratios are taken within a round and their median reported.

    .venv/bin/python benchmarks/engine_vs_transformers.py --rounds 5 --json-out /tmp/engine.json

transformers is a dev dependency; this script is not part of the service.
"""

from __future__ import annotations

import argparse
import copy
import json
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import AutoModelForSequenceClassification

from glassbox.service.bench.measure import Passes, Variant, machine, paired_speedup, summarize, timed_pass, warm_up
from glassbox.service.bench.mix import Batches, TextMix, make_batches, read_mix
from glassbox.service.buckets import BucketTable, batch_buckets, length_buckets
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.files import HELDOUT_FILE
from glassbox.service.model.loader import load_model
from glassbox.service.types import FloatArray, IntArray, TokenBatch


def ours(model_dir: Path, quantize: str) -> Variant:
    engine = EagerEngine(load_model(model_dir).model, "cpu", "fp32", "int8" if quantize == "int8" else "none")
    engine.warmup()
    return Variant(f"glassbox-{quantize}", lambda batch: engine.run(batch).logits)


def reference(model_dir: Path, quantize: str) -> Variant:
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir), attn_implementation="sdpa").eval()
    if quantize == "int8":
        from torch.ao.quantization import quantize_dynamic

        model = copy.deepcopy(model)
        encoder = model.base_model.encoder if hasattr(model.base_model, "encoder") else model.base_model.transformer
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # The same layers glassbox quantizes: the encoder's Linear layers, not the pooler or the head.
            quantized = quantize_dynamic(encoder, {nn.Linear}, dtype=torch.qint8)
        setattr(model.base_model, "encoder" if hasattr(model.base_model, "encoder") else "transformer", quantized)

    def run(batch: TokenBatch) -> FloatArray:
        ids = torch.from_numpy(batch.ids)  # [n, width]
        # As a transformers user would call it: always with the attention mask the tokenizer returns.
        mask = torch.from_numpy((np.arange(batch.max_length)[None, :] < batch.lengths[:, None]).astype(np.int64))
        with torch.inference_mode():
            logits: FloatArray = model(input_ids=ids, attention_mask=mask).logits.numpy()
        return logits

    return Variant(f"transformers-{quantize}", run)


def compare(model_dir: Path, mix: TextMix, config_specs: list[str], variant_names: list[str], rounds: int,
            max_length: int = 256) -> dict[str, Any]:
    """Every (batching, variant) pair timed once per round, the variant order rotating; per config: the summaries
    and the paired speed ratios."""
    loaded = load_model(model_dir)
    tokenizer = loaded.text_tokenizer(max_length)
    configs: dict[str, Batches] = {}
    for spec in config_specs:
        order, size = spec.split(":")
        configs[spec] = make_batches(tokenizer, mix, int(size), sort=order == "sorted")
    builders = {"glassbox": ours, "transformers": reference}
    variants = []
    for name in variant_names:
        kind, quantize = name.rsplit("-", 1)
        variants.append(builders[kind](model_dir, quantize))
    for variant in variants:
        for batches in configs.values():
            warm_up(variant.run, batches)
    times: dict[tuple[str, str], list[IntArray]] = {}
    predictions: dict[tuple[str, str], IntArray] = {}
    for number in range(rounds):
        shift = number % len(variants)
        for spec, batches in configs.items():
            for variant in variants[shift:] + variants[:shift]:
                latencies, predicted = timed_pass(variant.run, batches)
                times.setdefault((spec, variant.name), []).append(latencies)
                predictions.setdefault((spec, variant.name), predicted)
        print(f"round {number + 1}/{rounds} done", flush=True)
    table = BucketTable(batch_buckets((1, 2, 4, 8, 16, 32, 64), 64), length_buckets((16, 32, 64, 128, 256), 256))
    results: dict[str, Any] = {}
    for spec, batches in configs.items():
        passes = {v.name: Passes(tuple(times[(spec, v.name)]), predictions[(spec, v.name)]) for v in variants}
        summaries = {name: summarize(p, batches, table, mix.labels) for name, p in passes.items()}
        ratios = {f"{a} / {b}": paired_speedup(passes[b], passes[a])
                  for a, b in (("glassbox-fp32", "transformers-fp32"), ("glassbox-int8", "transformers-int8"),
                               ("glassbox-int8", "glassbox-fp32"), ("transformers-int8", "transformers-fp32"))
                  if a in passes and b in passes}
        results[spec] = {"variants": summaries, "speed_ratios": ratios}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--texts", type=Path, default=None, help="default: the model's heldout.jsonl")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--configs", default="sorted:8,sorted:32,unsorted:32",
                        help="comma-separated ORDER:BATCH, ORDER being sorted or unsorted")
    parser.add_argument("--variants", default="glassbox-fp32,glassbox-int8,transformers-fp32,transformers-int8")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model_dir = (args.model or default_model_dir()).expanduser()
    mix = read_mix(args.texts or model_dir / HELDOUT_FILE, load_model(model_dir).labels)
    results = compare(model_dir, mix, args.configs.split(","), args.variants.split(","), args.rounds)
    report = {"model": str(model_dir), "texts": len(mix.texts), "rounds": args.rounds, "machine": machine(),
              "date": datetime.now(UTC).isoformat(timespec="seconds"), "configs": results}
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n{report['texts']} texts, {args.rounds} rounds, {report['machine']}")
    print("\n".join(table_lines(results, "accuracy")))


def table_lines(results: dict[str, Any], last: str, first: str = "") -> list[str]:
    """A markdown table of `compare`'s results (one row per batching and variant; `last` names the final column, a
    summary key), then the speed ratios. `first` leads every row (a family name) when given."""
    lead = "| family " if first else ""
    lines = [f"{lead}| batches | variant | seq/s (median) | batch p50 ms | batch p99 ms | {last.replace('_', ' ')} |",
             ("| --- " if first else "") + "| --- | --- | ---: | ---: | ---: | ---: |"]
    cell = f"| {first} " if first else ""
    for spec, result in results.items():
        for name, s in result["variants"].items():
            lines.append(f"{cell}| {spec} | {name} | {s['throughput_seq_per_s']:.0f} | {s['latency_ms']['p50']:.1f} "
                         f"| {s['latency_ms']['p99']:.1f} | {s[last]} |")
    lines += [f"{first + ' ' if first else ''}{spec}: {pair} speed = {ratio:.2f}x"
              for spec, result in results.items() for pair, ratio in result["speed_ratios"].items()]
    return lines


if __name__ == "__main__":
    main()
