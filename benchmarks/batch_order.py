"""The offline engine on batches as a server forms them (texts in arrival order) against length-sorted batches.

    .venv/bin/python -m benchmarks.batch_order [--batches 3,4,10] [--quantize none|int8] [--json OUT]

`benchmarks/serving.py` compares the server with the offline engine on length-sorted batches, its best case. A server
cannot sort: at 8 connections a batch is the 3 or 4 texts that happen to be waiting. This runs the default model's
mix (the first 500 texts) through the same offline engine (`benchmarks.serving.Offline`), in batches of each size,
sorted by length or in a random order (one fixed seed), one batch at a time on every core or two side by side with
the cores shared between them (as the server's two engine threads run them). Reported: sequences per second over the
mix, median of 2 passes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.serving import Offline
from glassbox.service.bench.measure import emit, machine
from glassbox.service.bench.mix import read_mix
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.loader import load_model


def measure(sizes: list[int], quantize: str) -> dict[str, Any]:
    model_dir = default_model_dir()
    texts = list(read_mix(model_dir / "heldout.jsonl", load_model(model_dir).labels).texts)[:500]
    offline = Offline(model_dir, texts, quantize)
    orders = {"sorted": offline.order, "arrival": np.random.default_rng(0).permutation(len(texts))}
    rows = []
    for size in sizes:
        for order_name, order in orders.items():
            for side_by_side in (1, 2) if torch.get_num_threads() >= 2 else (1,):
                rate = offline.pass_rate(size, side_by_side, order)
                rows.append({"batch": size, "order": order_name, "side_by_side": side_by_side, "seq_per_s": rate})
                print(f"batch {size:>3} {order_name:<7} side by side {side_by_side}: {rate:6.1f} seq/s",
                      file=sys.stderr)
    return {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "texts": len(texts),
            "quantize": quantize, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="3,4,10", help="batch sizes, comma-separated")
    parser.add_argument("--quantize", choices=("none", "int8"), default="none")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    emit(measure([int(n) for n in args.batches.split(",")], args.quantize), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
