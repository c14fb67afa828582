"""`glassbox classify`'s flags. Only argparse here: the model, torch and the readers load when the command runs."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_WINDOW = 8192


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="JSON lines, CSV, plain text (one text a line) or a glassbox frames file; "
                                      "'-' reads stdin (give --format)")
    parser.add_argument("--out", default="-", help="output file (.csv: CSV, else JSON lines); '-': stdout (default)")
    parser.add_argument("--format", choices=("jsonl", "csv", "text", "frames"), default=None,
                        help="input format (default: from the file name: .jsonl/.ndjson/.json, .csv/.tsv, .txt, "
                             ".frames/.gbf)")
    parser.add_argument("--out-format", choices=("jsonl", "csv"), default=None,
                        help="output format (default: from --out's name; JSON lines on stdout)")
    parser.add_argument("--text-field", "--text-column", dest="text_field", default="text",
                        help="JSON field or CSV column holding the text (default: text)")
    parser.add_argument("--pair-field", "--pair-column", dest="pair_field", default=None,
                        help="JSON field or CSV column holding a second text (default: text_pair, when present)")
    parser.add_argument("--id-field", "--id-column", dest="id_field", default=None,
                        help="JSON field or CSV column holding the id written with each result (default: id, when "
                             "present; else the line number)")
    parser.add_argument("--delimiter", default=None, help="CSV delimiter (default: ',', a tab for .tsv)")
    parser.add_argument("--all-scores", action="store_true", help="write every label's score, not only the best")
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the built-in model)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--quantize", choices=("none", "int8"), default="none", help="CPU only")
    parser.add_argument("--dtype", "--cpu-dtype", dest="dtype", choices=("auto", "fp32", "bf16"), default="auto",
                        help="CPU number format, as `glassbox serve --cpu-dtype` (docs/models.md)")
    parser.add_argument("--max-length", type=int, default=256, help="truncate texts to this many tokens")
    parser.add_argument("--oversize", choices=("truncate", "reject"), default="truncate",
                        help="texts longer than --max-length: truncate them, or treat them as bad lines")
    parser.add_argument("--batch-tokens", type=int, default=8192,
                        help="most padded tokens in one engine batch (rows x the batch's longest text)")
    parser.add_argument("--max-batch-size", type=int, default=64, help="most texts in one engine batch")
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                        help="inputs read, length-sorted and written at a time: memory stays bounded by it, and "
                             "--resume restarts at its boundaries")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--engine-threads", type=int, default=0,
                        help="CPU: batches run side by side (0: 2 on a host with 2 or more cores)")
    parser.add_argument("--on-error", choices=("skip", "stop"), default="stop",
                        help="a bad line (invalid JSON or UTF-8, missing field, over-long under --oversize reject): "
                             "skip it (into --errors) or stop the run there (default)")
    parser.add_argument("--errors", type=Path, default=None, help="JSON lines file for the bad lines")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted run into the same --out from its last checkpoint")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar on stderr (default: when stderr is a terminal)")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve the run's Prometheus metrics on this port while it goes")
    parser.add_argument("--summary", type=Path, default=None, help="also write the final summary here as JSON")


def run(args: argparse.Namespace) -> int:
    from glassbox.service.bulk.command import execute

    return execute(args)
