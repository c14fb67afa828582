"""glassbox's eager engine against transformers, one model of every family in the same run: BERT, DistilBERT, RoBERTa,
XLM-RoBERTa, CamemBERT and ELECTRA classifiers with random weights at the default model's geometry (6 layers, hidden
384, 12 heads), built with transformers' own classes and saved with save_pretrained (tests/families.py builds them),
timed on the same texts with the rotation and paired ratios of engine_vs_transformers.py. Random weights are fine for
speed: the arithmetic does not depend on the values.

    .venv/bin/python benchmarks/families_vs_transformers.py --rounds 3 --json-out /tmp/families.json

transformers is a dev dependency; this script is not part of the service.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's tests/ package

from benchmarks.engine_vs_transformers import compare, table_lines
from glassbox.service.bench.measure import machine
from glassbox.service.bench.mix import read_mix, synthetic_mix
from tests.families import FAMILY_CASES, MINILM, TINY, save_family_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(FAMILY_CASES))
    parser.add_argument("--size", choices=("minilm", "tiny"), default="minilm")
    parser.add_argument("--texts", type=Path, default=None, help="default: a synthetic mix of 256 texts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", default="sorted:32")
    parser.add_argument("--variants", default="glassbox-fp32,glassbox-int8,transformers-fp32")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    size = MINILM if args.size == "minilm" else TINY
    mix = synthetic_mix() if args.texts is None else read_mix(args.texts, ())
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for case in args.cases.split(","):
            path = save_family_model(Path(scratch) / case, case, "single", size=size).path
            print(f"{case}:", flush=True)
            results[case] = compare(path, mix, args.configs.split(","), args.variants.split(","), args.rounds,
                                    args.max_length)
    report = {"size": args.size, "texts": len(mix.texts), "source": mix.source, "rounds": args.rounds,
              "max_length": args.max_length, "machine": machine(),
              "date": datetime.now(UTC).isoformat(timespec="seconds"), "families": results}
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n{report['texts']} texts ({mix.source}), {args.rounds} rounds, {report['machine']}")
    lines = [line for case, configs in results.items() for line in table_lines(configs, "mean_tokens", case)]
    header = lines[:2]
    rows = [line for line in lines if line.startswith("| ") and line not in header]
    print("\n".join(header + rows + [line for line in lines if not line.startswith("|")]))


if __name__ == "__main__":
    main()
