"""`glassbox chaos slow-clients --target URL --connections N --mode headers|body|reader --rate B --duration S`.

An attack on a server you run: N connections that trickle their header block or body at B bytes/s each, or read
answers at B bytes/s. It refuses targets outside loopback unless given --allow-remote, which is meant for your own
staging server and nothing else. Ctrl-C ends it early and still reports. Usage errors exit with 2; an attack that
could not open a single connection exits with 1 (after its report), so a pipeline does not mistake it for a pass.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys

from rich.console import Console
from rich.table import Table

from glassbox.chaos.slowclients import (
    CLASSIFY_PATH,
    DEFAULT_PIPELINE_DEPTH,
    DEFAULT_TEXTS_PER_REQUEST,
    MAX_CONNECTIONS,
    MAX_DURATION_S,
    MODES,
    SlowClientConfig,
    SlowClientReport,
)
from glassbox.chaos.slowclients import run_slow_clients as attack


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="base URL of the server under test, e.g. http://127.0.0.1:8000")
    parser.add_argument("--connections", type=int, required=True,
                        help=f"connections held at once, 1..{MAX_CONNECTIONS}")
    parser.add_argument("--mode", choices=MODES, required=True,
                        help="headers: trickle an endless header block; body: full headers, then trickle the body; "
                             "reader: pipeline complete requests and read the answers slowly")
    parser.add_argument("--rate", type=float, required=True, help="bytes per second, per connection")
    parser.add_argument("--duration", type=float, required=True, help=f"seconds, at most {MAX_DURATION_S:g}")
    parser.add_argument("--path", default=CLASSIFY_PATH, help=f"route to aim at (default {CLASSIFY_PATH})")
    parser.add_argument("--ramp", type=float, default=1.0, help="seconds over which connections open (default 1)")
    parser.add_argument("--no-reconnect", action="store_true",
                        help="do not open a new connection when the server cuts one")
    parser.add_argument("--body-bytes", type=int, default=None,
                        help="body mode: declared Content-Length (default: what --rate covers in --duration, "
                             "at most 1 MiB)")
    parser.add_argument("--pipeline-depth", type=int, default=DEFAULT_PIPELINE_DEPTH,
                        help="reader mode: unanswered requests per connection (default %(default)s)")
    parser.add_argument("--texts-per-request", type=int, default=DEFAULT_TEXTS_PER_REQUEST,
                        help="reader mode: texts in each request (default %(default)s)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a target outside loopback: for your own staging server only")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def config_from_args(args: argparse.Namespace) -> SlowClientConfig:
    return SlowClientConfig(
        target=args.target, connections=args.connections, mode=args.mode, bytes_per_s=args.rate,
        duration_s=args.duration, path=args.path, ramp_s=args.ramp, reconnect=not args.no_reconnect,
        allow_remote=args.allow_remote, body_bytes=args.body_bytes, pipeline_depth=args.pipeline_depth,
        texts_per_request=args.texts_per_request)


def table(report: SlowClientReport) -> Table:
    out = Table(title=f"glassbox chaos slow-clients: {report.mode} on {report.target}", show_header=False)
    out.add_column("what")
    out.add_column("value", justify="right")
    out.add_row("ran", f"{report.elapsed_s:.1f} s, {report.connections} slots at {report.bytes_per_s:g} B/s each")
    out.add_row("opened", f"{report.opened} ({report.reconnects} after a cut)")
    cuts = ", ".join(f"{how} {n}" for how, n in report.cuts.items() if n) or "none"
    out.add_row("cut by the server", f"{report.closed_by_server} ({cuts})")
    out.add_row("still open at the end", str(report.still_open_at_end))
    out.add_row("statuses", ", ".join(f"{s}: {n}" for s, n in sorted(report.statuses.items())) or "none")
    if report.held.count:
        out.add_row("held before the cut", f"median {report.held.median_s:.3f} s, max {report.held.max_s:.3f} s")
    out.add_row("bytes sent / received", f"{report.bytes_sent} / {report.bytes_received}")
    for kind, n in sorted(report.errors.items()):
        out.add_row(f"error {kind}", str(n))
    return out


# The flag behind each SlowClientConfig field that config_from_args sets, so a refusal names what the user typed.
FLAG_OF_FIELD = {"target": "--target", "connections": "--connections", "mode": "--mode", "bytes_per_s": "--rate",
                 "duration_s": "--duration", "path": "--path", "ramp_s": "--ramp", "body_bytes": "--body-bytes",
                 "pipeline_depth": "--pipeline-depth", "texts_per_request": "--texts-per-request"}


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ValueError as exc:
        field, _, rest = str(exc).partition(" ")  # SlowClientConfig's messages start with the field's name
        print(f"glassbox chaos slow-clients: {FLAG_OF_FIELD.get(field, field)} {rest}", file=sys.stderr)
        return 2

    async def main() -> SlowClientReport:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not off the main thread
            loop.add_signal_handler(signal.SIGINT, stop.set)
        try:
            return await attack(config, stop)
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGINT)

    try:
        report = asyncio.run(main())
    except ValueError as exc:  # the target does not resolve, or is not loopback without --allow-remote
        print(f"glassbox chaos slow-clients: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        Console().print(table(report))
    return 0 if report.opened else 1
