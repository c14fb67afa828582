"""CPU number formats side by side: fp32, bf16 and int8, offline and served.

    .venv/bin/python -m benchmarks.cpu_dtypes [--rounds 5] [--served-rounds 4] [--duration 8] [--connections 8]
                                              [--skip-served] [--json OUT]

1. `bert_base`: a BERT-base sized classifier (12 layers, hidden 768, 12 heads, random weights from a fixed seed) in
   glassbox's own CPU engine (`EagerEngine`, the TorchScript recording the server runs), batches of 8 texts x 32
   tokens, fp32 / bf16 / int8 in alternating rounds; seq/s per variant (median of rounds) and each one's per-round
   ratio to fp32 (median).
2. `builtin`: the built-in model (or `--model DIR`) on its held-out mix in length-sorted batches of 8, what
   `glassbox bench engine --compare --batch-size 8` runs: speed ratios, answer agreement and accuracy against fp32.
3. `served`: two `glassbox serve` side by side on the built-in model, one with the defaults (`--cpu-dtype auto`) and
   one with `--cpu-dtype fp32` (the default before bf16), `wrk -t1 -c<connections>` with one held-out text per
   request on one server at a time, the order alternating every round; answered req/s per server (median of rounds)
   and the per-round ratio (median). Each server's start-up line says which format it chose.

The load generator shares the machine's cores with the server, as in the other serving benchmarks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.serving import free_port, stop_on_sigterm, wait_ready, wrk
from benchmarks.telemetry_overhead import start_server
from glassbox.service.bench.engine import add_arguments, bench
from glassbox.service.bench.measure import Variant, emit, interleave, machine, paired_speedup, warm_up
from glassbox.service.bench.mix import Batches
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.model.bert import BertClassifier
from glassbox.service.model.config import ModelConfig
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.files import HELDOUT_FILE
from glassbox.service.types import TokenBatch

BERT_BASE = ModelConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12,
                        hidden_act="gelu", pad_token_id=0, id2label=("negative", "positive"),
                        architecture="BertForSequenceClassification")


def bert_base(rounds: int, batch: int = 8, length: int = 32, batches: int = 8) -> dict[str, Any]:
    model = BertClassifier(BERT_BASE)
    model.init_weights(torch.Generator().manual_seed(0))
    model.eval()
    rng = np.random.default_rng(0)
    cut = tuple(TokenBatch(ids=rng.integers(5, BERT_BASE.vocab_size, (batch, length)).astype(np.int64),
                           lengths=np.full(batch, length, dtype=np.int64), truncated=np.zeros(batch, dtype=bool))
                for _ in range(batches))
    mix = Batches(batches=cut, rows=tuple(np.arange(i * batch, (i + 1) * batch) for i in range(batches)), sorted=True)
    engines = {"fp32": EagerEngine(model, "cpu", "fp32"), "bf16": EagerEngine(model, "cpu", "bf16"),
               "int8": EagerEngine(model, "cpu", "fp32", "int8")}
    variants = []
    for name, engine in engines.items():
        engine.warmup()
        variant = Variant(name, lambda b, e=engine: e.run(b).logits)
        warm_up(variant.run, mix)
        variants.append(variant)
    passes = interleave(variants, mix, rounds)
    reference = engines["fp32"].run(cut[0]).logits
    return {
        "shape": f"{batch}x{length}", "rounds": rounds,
        "seq_per_s": {name: round(statistics.median(mix.texts / s for s in p.pass_seconds), 1)
                      for name, p in passes.items()},
        "speedup_vs_fp32": {name: paired_speedup(passes["fp32"], passes[name]) for name in ("bf16", "int8")},
        "max_logit_difference_vs_fp32": {
            name: round(float(np.abs(engines[name].run(cut[0]).logits - reference).max()), 4)
            for name in ("bf16", "int8")
        },
    }


def builtin(rounds: int, model_dir: Path | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    model = ["--model", str(model_dir)] if model_dir is not None else []
    report = bench(parser.parse_args(["--compare", "--batch-size", "8", "--repeat", str(rounds), *model]))
    return {"variants": {name: {"seq_per_s": v["throughput_seq_per_s"], "accuracy": v["accuracy"]}
                         for name, v in report["variants"].items()},
            "comparisons": report["comparisons"], "texts": report["mix"]["texts"]}


def served(rounds: int, duration_s: int, connections: int, model_dir: Path | None = None) -> dict[str, Any]:
    model_dir = model_dir or default_model_dir()
    work = Path(tempfile.mkdtemp(prefix="glassbox-cpu-dtypes-"))
    bodies = work / "bodies.jsonl"
    texts = [json.loads(line)["text"] for line in (model_dir / HELDOUT_FILE).read_text().splitlines() if line]
    bodies.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    sides = {"default": [], "fp32": ["--cpu-dtype", "fp32"]}
    ports = {name: free_port() for name in sides}
    servers = {name: start_server(model_dir, ports[name], ["--log-format", "text", "--log-level", "info", *extra],
                                  work / f"{name}.log") for name, extra in sides.items()}
    runs: dict[str, list[float]] = {name: [] for name in sides}
    p99: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for port in ports.values():
            wait_ready(f"http://127.0.0.1:{port}")
            wrk(f"http://127.0.0.1:{port}", bodies, connections, 3)  # warm-up: every kernel shape seen once
        for index in range(rounds):
            for name in (sides if index % 2 == 0 else reversed(list(sides))):
                result = wrk(f"http://127.0.0.1:{ports[name]}", bodies, connections, duration_s)
                runs[name].append(result["requests_per_s"])
                p99[name].append(result["p99_ms"])
    finally:
        for proc in servers.values():
            proc.terminate()
        for proc in servers.values():
            proc.wait(timeout=60)
    chosen = {name: next((line.split("glassbox.engine: ", 1)[1] for line in (work / f"{name}.log").read_text()
                          .splitlines() if "CPU number format" in line), "") for name in sides}
    ratios = [d / f for d, f in zip(runs["default"], runs["fp32"], strict=True)]
    return {"connections": connections, "duration_s": duration_s, "rounds": rounds, "chosen": chosen,
            "requests_per_s": runs, "p99_ms": p99,
            "median_requests_per_s": {name: round(statistics.median(r), 1) for name, r in runs.items()},
            "ratio_default_vs_fp32": round(statistics.median(ratios), 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of the offline comparisons")
    parser.add_argument("--served-rounds", type=int, default=4)
    parser.add_argument("--duration", type=int, default=8, help="seconds of each wrk run")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--skip-served", action="store_true")
    parser.add_argument("--model", type=Path, default=None, help="model directory with a heldout.jsonl (default: the "
                                                                  "built-in model)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    stop_on_sigterm()
    results: dict[str, Any] = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    results["bert_base"] = bert_base(args.rounds)
    results["builtin"] = builtin(args.rounds, args.model)
    if not args.skip_served:
        results["served"] = served(args.served_rounds, args.duration, args.connections, args.model)
    emit(results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
