"""The offline engine on batches as a server forms them (texts in arrival order) against length-sorted batches.

    .venv/bin/python -m benchmarks.batch_order [--batches 3,4,10] [--quantize none|int8] [--json OUT]

`benchmarks/serving.py` compares the server with the offline engine on length-sorted batches, its best case. A server
cannot sort: at 8 connections a batch is the 3 or 4 texts that happen to be waiting. This runs the default model's
mix (the first 500 texts) through the engine the server uses, in batches of each size, sorted by length or in a
random order (one fixed seed), one batch at a time on every core or two side by side with the cores shared between
them (as the server's two engine threads run them). Reported: sequences per second over the mix, and the median
time of one batch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from service.bench.measure import emit, machine
from service.bench.mix import read_mix
from service.engines.eager import EagerEngine
from service.model.default import default_model_dir
from service.model.loader import load_model
from service.settings import Settings
from service.tokenizer import TextTokenizer


def _run_all(engine: EagerEngine, batches: list[Any], times: list[float]) -> None:
    for batch in batches:
        begin = time.perf_counter()
        engine.run(batch)
        times.append(time.perf_counter() - begin)


def measure(sizes: list[int], quantize: str) -> dict[str, Any]:
    model_dir = default_model_dir()
    loaded = load_model(model_dir)
    texts = list(read_mix(model_dir / "heldout.jsonl", loaded.labels).texts)[:500]
    tokenizer = TextTokenizer.from_file(loaded.tokenizer_file, Settings().max_length,
                                        loaded.config.max_position_embeddings)
    encoded = tokenizer.encode(texts)
    engine = EagerEngine(loaded.model, quantize=quantize)  # type: ignore[arg-type]
    engine.warmup()
    cores = torch.get_num_threads()
    orders = {"sorted": np.argsort(encoded.lengths, kind="stable"),
              "arrival": np.random.default_rng(0).permutation(encoded.size)}
    rows = []
    for size in sizes:
        for order_name, order in orders.items():
            batches = [encoded.select(order[i:i + size]) for i in range(0, encoded.size, size)]
            for side_by_side in (1, 2) if cores >= 2 else (1,):
                torch.set_num_threads(max(1, cores // side_by_side))
                for batch in batches[:3]:
                    engine.run(batch)
                times: list[float] = []
                start = time.perf_counter()
                threads = [threading.Thread(target=_run_all, args=(engine, batches[i::side_by_side], times))
                           for i in range(side_by_side)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                rows.append({"batch": size, "order": order_name, "side_by_side": side_by_side,
                             "seq_per_s": encoded.size / (time.perf_counter() - start),
                             "batch_ms_median": statistics.median(times) * 1e3})
                print(f"batch {size:>3} {order_name:<7} side by side {side_by_side}: "
                      f"{rows[-1]['seq_per_s']:6.1f} seq/s, one batch {rows[-1]['batch_ms_median']:.1f} ms",
                      file=sys.stderr)
    torch.set_num_threads(cores)
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
