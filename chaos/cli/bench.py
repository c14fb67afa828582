"""`glassbox bench --target URL --rate R --duration S`: open-loop load against a running server.

Without --json: a table on stdout. With --json: one JSON object on stdout. The progress bar, when shown, goes to
stderr either way. Usage errors (a bad rate, duration or URL) exit with 2, as argparse's own do; a run in which no
request succeeded (a dead port, a wrong URL, every answer an error) still reports what happened, and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from glassbox.chaos.cli.loop import run_loop
from glassbox.chaos.loadgen.bodies import PROTOCOLS
from glassbox.chaos.loadgen.generator import MAX_CONNECTIONS, LoadConfig, LoadGenerator
from glassbox.chaos.loadgen.plan import PROFILES, RatePlan
from glassbox.chaos.loadgen.result import LoadResult
from glassbox.chaos.loadgen.texts import read_texts

MAX_DURATION_S = 3600.0
MAX_RATE = 100_000.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Nothing here is argparse-required: `glassbox bench engine ...` shares this parser's namespace and must not
    # need --target. run() checks what a load run needs.
    parser.add_argument("--target", default=None, help="base URL of a glassbox server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--rate", type=float, default=None, help="requests per second (the peak, for step/burst)")
    parser.add_argument("--duration", type=float, default=None, help=f"seconds of load, at most {MAX_DURATION_S:g}")
    parser.add_argument("--profile", choices=PROFILES, default="steady",
                        help="steady: the rate throughout; step: 25/50/75/100%% of it in four equal steps; "
                             "burst: the rate with 4x bursts for 10%% of every period (10 s, or half the run)")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="json",
                        help="json: application/json; frames: application/x-glassbox-frames")
    parser.add_argument("--texts", type=Path, default=None,
                        help="one text per line (default: a built-in mix of short, medium and long review texts)")
    parser.add_argument("--connections", type=int, default=64, help="keep-alive connections (default 64)")
    parser.add_argument("--timeout", type=float, default=10.0, help="per-request timeout in seconds, counted from "
                                                                     "the intended send time (default 10)")
    parser.add_argument("--max-outstanding", type=int, default=10_000,
                        help="queued + in-flight requests beyond which new ones count as 'backlog' errors")
    parser.add_argument("--seed", type=int, default=0, help="order of the texts, and the built-in mix")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar on stderr (default: when stderr is a terminal)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def config_from_args(args: argparse.Namespace) -> LoadConfig:
    """The LoadConfig the flags ask for; ValueError with a message fit for the user when they do not add up."""
    if args.target is None or args.rate is None or args.duration is None:
        raise ValueError("--target, --rate and --duration are required (or name a subcommand: glassbox bench engine)")
    if not (math.isfinite(args.rate) and 0 < args.rate <= MAX_RATE):
        raise ValueError(f"--rate must be above 0 and at most {MAX_RATE:g} requests/s, got {args.rate:g}")
    if not (math.isfinite(args.duration) and 0 < args.duration <= MAX_DURATION_S):
        raise ValueError(f"--duration must be above 0 and at most {MAX_DURATION_S:g} s, got {args.duration:g}")
    if not 1 <= args.connections <= MAX_CONNECTIONS:
        raise ValueError(f"--connections must be between 1 and {MAX_CONNECTIONS}, got {args.connections}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ValueError(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    texts = None
    if args.texts is not None:
        try:
            texts = read_texts(args.texts)
        except OSError as exc:
            raise ValueError(f"--texts {args.texts}: {exc.strerror or exc}") from None
    # The CLI reports percentiles and counts only, so a long run at a high rate keeps no per-request samples.
    return LoadConfig(target=args.target.rstrip("/"), plan=RatePlan.of(args.profile, args.rate, args.duration),
                      protocol=args.protocol, texts=texts, connections=args.connections, timeout_s=args.timeout,
                      seed=args.seed, max_outstanding=args.max_outstanding, keep_samples=False)


def table(result: LoadResult) -> Table:
    out = Table(title=f"glassbox bench: {result.config.get('target', '')}", show_header=False)
    out.add_column("what")
    out.add_column("value", justify="right")
    out.add_row("window", f"{result.duration_s:.1f} s (+{result.elapsed_s - result.duration_s:.1f} s drain)")
    out.add_row("offered", f"{result.offered_rate:.1f} req/s ({result.scheduled} requests)")
    out.add_row("achieved", f"{result.achieved_rate:.1f} req/s answered, {result.ok_rate:.1f} req/s ok")
    out.add_row("ok", str(result.ok))
    for kind, count in result.errors.items():
        if count:
            out.add_row(f"error {kind}", str(count))
    if result.cancelled:
        out.add_row("cancelled", str(result.cancelled))
    for name, value in result.percentiles().items():
        out.add_row(f"latency {name}", f"{value:.2f} ms")
    return out


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"glassbox bench: {exc}", file=sys.stderr)
        return 2
    generator = LoadGenerator(config)
    show = args.progress if args.progress is not None else sys.stderr.isatty()

    async def main() -> LoadResult:
        # Ctrl-C ends the run early but still reports what was measured up to then.
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not off the main thread
            loop.add_signal_handler(signal.SIGINT, generator.stop)
        try:
            return await generator.run(progress=show)
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGINT)

    result = run_loop(main)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        Console().print(table(result))
    if result.ok == 0:
        kinds = ", ".join(f"{count} {kind}" for kind, count in result.errors.items() if count) or "no answer"
        print(f"glassbox bench: no request succeeded ({kinds}); is a glassbox server listening at {config.target}?",
              file=sys.stderr)
        return 1
    return 0
