"""Attention text by text against attention on the padded grid: the CPU engine alone, batches in arrival order.

    .venv/bin/python -m benchmarks.varlen_attention [--threads 1] [--quantize none|int8] [--batches 3,4,8,16,32]
        [--rounds 3] [--json OUT]

Two engines (`EagerEngine`, recorded with TorchScript as `glassbox serve` runs it) on the default model, one with
`BertClassifier.varlen_attention` on (the default) and one with it off, run the mix's texts in one random order (as
a server meets them: a batch holds whatever arrived, so its lengths are mixed) in batches of each size, alternating
the two engines round by round. Reported per batch size: sequences per second of each (median of rounds) and their
ratio, with `--threads` intra-op threads (the server's engine threads run with one each when two batches run side by
side, and with both when one runs alone).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from glassbox.service.bench.measure import emit, machine
from glassbox.service.bench.mix import read_mix
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.loader import load_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quantize", choices=("none", "int8"), default="none")
    parser.add_argument("--batches", default="3,4,8,16,32")
    parser.add_argument("--texts", type=int, default=480, help="texts of the mix per pass")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_dir = args.model or default_model_dir()
    loaded = load_model(model_dir)
    tokenizer = loaded.text_tokenizer(256)
    texts = list(read_mix(model_dir / "heldout.jsonl", loaded.labels).texts)[:args.texts]
    texts = [texts[i] for i in np.random.default_rng(1).permutation(len(texts))]  # arrival order: lengths mixed
    engines: dict[str, EagerEngine] = {}
    for name, on in (("grid", False), ("text_by_text", True)):
        loaded.model.varlen_attention = on  # read when the engine records the forward pass
        engines[name] = EagerEngine(loaded.model, quantize=args.quantize)
        engines[name].warmup()
    loaded.model.varlen_attention = True
    results: dict[str, Any] = {}
    for size in (int(b) for b in args.batches.split(",")):
        batches = [tokenizer.encode(texts[i:i + size]) for i in range(0, len(texts), size)]
        rates: dict[str, list[float]] = {name: [] for name in engines}
        for round_ in range(args.rounds):
            for name in list(engines) if round_ % 2 == 0 else list(engines)[::-1]:
                start = time.perf_counter()
                for batch in batches:
                    engines[name].run(batch)
                rates[name].append(len(texts) / (time.perf_counter() - start))
        grid, text_by_text = statistics.median(rates["grid"]), statistics.median(rates["text_by_text"])
        results[str(size)] = {"grid_seq_per_s": round(grid, 1), "text_by_text_seq_per_s": round(text_by_text, 1),
                              "ratio": round(text_by_text / grid, 3),
                              "rounds": {name: [round(r, 1) for r in values] for name, values in rates.items()}}
        print(f"batch {size}: {results[str(size)]}", file=sys.stderr)
    emit({"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          "command": " ".join(["python -m benchmarks.varlen_attention", *(argv or sys.argv[1:])]),
          "threads": args.threads, "quantize": args.quantize, "texts": len(texts), "batches": results}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
