"""What counting the model's answers costs: `PredictionStats.on_batch` (telemetry/predictions.py) per batch and per
text, at several batch sizes and label counts, single-label and multi-label.

    .venv/bin/python -m benchmarks.prediction_metrics [--repeat 20000] [--json OUT]

Each case feeds the same batch of random logits (and its rows' token counts) `--repeat` times to one configured
PredictionStats, on this thread, and reports the thread's CPU time (`time.thread_time`) per call and per text; a
call's time includes its share of the counting, which runs once for all the batches of a window slot (or 4096 rows).
A scrape of the families is timed too. The figure to hold against the target (2 µs a text at batch 32) is
`us_per_text` at batch 32.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from glassbox.service.bench.measure import emit, machine
from glassbox.service.observer import BatchRecord
from glassbox.service.types import EngineTiming, ProblemType
from glassbox.telemetry.metrics import build_metrics
from glassbox.telemetry.predictions import PredictionStats

TIMING = EngineTiming(0, 1, "cpu", "eager", 1, 1, 1, None)


def one_case(rows: int, labels: int, problem: ProblemType, repeat: int) -> dict[str, Any]:
    stats = PredictionStats(build_metrics(CollectorRegistry(), process_collectors=False).predictions)
    stats.configure([f"label_{i}" for i in range(labels)], problem)
    rng = np.random.default_rng(0)
    record = BatchRecord(1, TIMING, (), 0, logits=rng.normal(size=(rows, labels)).astype(np.float32),
                         lengths=rng.integers(5, 120, size=rows).astype(np.int64))
    for _ in range(200):
        stats.on_batch(record)
    start = time.thread_time()
    for _ in range(repeat):
        stats.on_batch(record)
    per_call_us = (time.thread_time() - start) / repeat * 1e6
    start = time.thread_time()
    for _ in range(200):
        list(stats.collect())
    scrape_us = (time.thread_time() - start) / 200 * 1e6
    return {"rows": rows, "labels": labels, "problem": problem, "us_per_batch": round(per_call_us, 2),
            "us_per_text": round(per_call_us / rows, 3), "scrape_us": round(scrape_us, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    cases = [one_case(rows, labels, problem, args.repeat)
             for problem in ("single_label_classification", "multi_label_classification")
             for labels in (2, 20) for rows in (1, 8, 32, 128)]
    for case in cases:
        print(case, file=sys.stderr)
    emit({"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          "command": " ".join(["python -m benchmarks.prediction_metrics", *(argv or sys.argv[1:])]),
          "cases": cases}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
