"""`glassbox chaos run FILE`: run one experiment and write its journal, report and plots.

Exit codes, so a staging pipeline can gate on them:
  0  completed: the verdict passed
  1  failed: the experiment ran and the verdict failed (the journal's `reason` lists the failed checks)
  2  usage: a bad flag or an invalid experiment file (nothing ran, no journal)
  3  aborted: it could not run (target unreachable or not ready, chaos API missing or token refused, local server
     did not start, faults already armed)
  4  skipped: the target cannot inject this fault (409 chaos_unsupported, e.g. a GPU fault on a CPU server)
  130 interrupted by SIGINT or SIGTERM (rollbacks ran; the journal says how far it got)
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import math
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from glassbox.chaos.cli.loop import run_loop
from glassbox.chaos.client import TOKEN_ENV
from glassbox.chaos.experiment import ExperimentError
from glassbox.chaos.grafana import TOKEN_ENV as GRAFANA_TOKEN_ENV
from glassbox.chaos.record import EXIT_USAGE, Event, RunRecord
from glassbox.chaos.runner import RunOptions, run_experiment
from glassbox.chaos.schema import load_experiment
from glassbox.service.secret_flag import add_secret_flag

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "experiments"  # shipped as package data


def builtin_experiments() -> list[str]:
    return sorted(path.stem for path in BUILTIN_DIR.glob("*.yaml"))


def experiment_path(given: Path) -> Path:
    """`given` itself when it exists; else a bare name of a built-in experiment (`oom-fallback`) names its file, so
    an installed glassbox (a container, a wheel) runs them without a source checkout."""
    builtin = BUILTIN_DIR / f"{given.name}.yaml"
    bare = given.suffix == "" and len(given.parts) == 1
    if not given.exists() and bare and builtin.is_file():
        return builtin
    if not given.exists() and bare:
        names = builtin_experiments()
        close = difflib.get_close_matches(given.name, names, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"no experiment file {str(given)!r} and no built-in experiment of that name; {hint}"
                         f"the built-in ones are {', '.join(names)}")
    return given


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n", 1)[1] if __doc__ else None
    parser.add_argument("file", type=Path, help="experiment YAML, or the name of a built-in one: "
                        + ", ".join(builtin_experiments()))
    parser.add_argument("--target", default=None,
                        help="base URL of a server started with --chaos (default: start a local one for the run)")
    parser.add_argument("--token-file", type=Path, default=None,
                        help=f"read the chaos token of --target from this file (default: env {TOKEN_ENV})")
    add_secret_flag(parser, "--token", TOKEN_ENV, "--token-file")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: chaos-results/NAME-YYYYmmdd-HHMMSS)")
    parser.add_argument("--grafana-url", default=None, help="post annotations at inject and rollback to this Grafana")
    parser.add_argument("--grafana-token-file", type=Path, default=None,
                        help=f"read the Grafana API token from this file (default: env {GRAFANA_TOKEN_ENV})")
    add_secret_flag(parser, "--grafana-token", GRAFANA_TOKEN_ENV, "--grafana-token-file")
    parser.add_argument("--model", default=None, help="local server: model directory (overrides the file's)")
    parser.add_argument("--serve-args", default="", metavar="'FLAGS'",
                        help="local server: extra `glassbox serve` flags, appended to the file's, as one string: "
                             "--serve-args='--no-cpu-fallback --threads 1'")
    parser.add_argument("--duration-scale", type=float, default=1.0,
                        help="multiply every phase's duration (e.g. 0.1 for a quick run)")
    parser.add_argument("--rate-scale", type=float, default=1.0, help="multiply every phase's request rate")
    parser.add_argument("--scrape-interval", type=float, default=0.5,
                        help="seconds between looks at /metrics and /readyz (default 0.5)")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples per CI (default 2000)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="let slow-client attackers aim at a non-loopback --target (your own staging only)")
    parser.add_argument("--port", type=int, default=None,
                        help="local server: listen on this port of 127.0.0.1 (default: a free one)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="print each step (server start, capacity, phases, faults) to stderr as it happens "
                             "(default: when stderr is a terminal)")


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file is not None:
        return _read_secret("--token-file", args.token_file)
    return os.environ.get(TOKEN_ENV) or None


def _read_secret(flag: str, path: Path) -> str:
    """A token file's text without its trailing newline; UsageError naming the flag when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    except UnicodeDecodeError:  # a ValueError, not an OSError: a binary file given by mistake
        raise UsageError(f"{flag}: {path} is not UTF-8 text") from None


class UsageError(ValueError):
    """Flags that do not add up; the message is for the user."""


def _positive_finite(flag: str, value: float) -> None:
    """argparse's float() takes 'nan' and 'inf': `nan <= 0` is False, so a plain sign check lets them through, and
    a nan scrape interval then never times out (scraping stops in silence) while a nan scale fails deep in the run
    with a traceback, after the output directory was made."""
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{flag} must be a positive finite number, got {value}")


def options_from_args(args: argparse.Namespace, name: str) -> RunOptions:
    """RunOptions from the flags; UsageError when they do not add up. Called before the experiment is scaled or
    anything is written, so a bad flag is exit 2 and nothing else."""
    _positive_finite("--duration-scale", args.duration_scale)
    _positive_finite("--rate-scale", args.rate_scale)
    _positive_finite("--scrape-interval", args.scrape_interval)
    if args.resamples < 100:
        raise UsageError(f"--resamples must be at least 100, got {args.resamples}")
    if args.target is not None and not args.target.startswith(("http://", "https://")):
        raise UsageError(f"--target must be an http:// or https:// URL, got {args.target!r}")
    if args.target is None and args.token_file:
        raise UsageError("--token-file is for --target; a local server gets a fresh token of its own")
    if args.target is not None and (args.model or args.serve_args or args.port is not None):
        raise UsageError("--model, --serve-args and --port configure the local server; with --target there is none")
    if args.port is not None and not 1 <= args.port <= 65535:
        raise UsageError(f"--port must be 1..65535, got {args.port}")
    token = _token(args) if args.target is not None else None
    grafana_token = (_read_secret("--grafana-token-file", args.grafana_token_file)
                     if args.grafana_token_file is not None else None)
    out = args.out or Path("chaos-results") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return RunOptions(out_dir=out, target=args.target, token=token, model=args.model,
                      serve_args=tuple(shlex.split(args.serve_args)), grafana_url=args.grafana_url,
                      grafana_token=grafana_token, scrape_interval_s=args.scrape_interval,
                      resamples=args.resamples, allow_remote=args.allow_remote, port=args.port,
                      on_event=progress_printer() if _show_progress(args) else None)


def _show_progress(args: argparse.Namespace) -> bool:
    shown: bool = args.progress if getattr(args, "progress", None) is not None else sys.stderr.isatty()
    return shown


def progress_printer(out: TextIO | None = None) -> Callable[[Event], None]:
    """One line per timeline event, `[  12.3s] text`, counted from the first: a run is no longer silent for the
    minute or more it takes."""
    start: list[float] = []

    def show(event: Event) -> None:
        if not start:
            start.append(event.mono)
        print(f"[{event.mono - start[0]:7.1f}s] {event.text}", file=out or sys.stderr, flush=True)

    return show


def summary(record: RunRecord, out_dir: Path) -> str:
    lines = [f"{record.experiment.title}: {record.status.upper()} (exit {record.exit_code})"]
    if record.reason:
        lines.append(f"  {record.reason}")
    if record.verdict is not None:
        for check in record.verdict.checks:
            mark = "ok  " if check.ok else "FAIL"
            lines.append(f"  [{mark}] {check.group:<6} {check.name}: {check.measured} (tolerance {check.tolerance})")
    lines.append(f"  report: {out_dir / 'report.md'}")
    lines.append(f"  journal: {out_dir / 'journal.json'}")
    return "\n".join(lines)


async def execute(args: argparse.Namespace) -> tuple[RunRecord, Path]:
    """Load, scale and run the experiment, with SIGINT/SIGTERM turned into a graceful stop (rollbacks run); a
    second signal is not caught and ends the process the usual way."""
    loaded = load_experiment(experiment_path(args.file))
    options = options_from_args(args, loaded.name)  # the flags first: scaling by nan or inf is not an experiment
    experiment = loaded.scaled(args.duration_scale, args.rate_scale)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        print(f"\n{signal.Signals(signum).name}: stopping, rolling back (again to force)", file=sys.stderr)
        stop.set()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        return await run_experiment(experiment, options, stop), options.out_dir
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def run(args: argparse.Namespace) -> int:
    try:
        record, out_dir = run_loop(lambda: execute(args))
    except (ExperimentError, UsageError) as exc:
        message = exc.message if isinstance(exc, ExperimentError) else str(exc)
        print(f"glassbox chaos run: {message}", file=sys.stderr)
        return EXIT_USAGE
    print(summary(record, out_dir))
    return record.exit_code
