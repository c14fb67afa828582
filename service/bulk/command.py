"""`glassbox classify INPUT [--out OUTPUT]`: classify a file of texts at the engine's full speed.

The input is read a window at a time; each window is tokenized, cut into length-sorted batches under the token
budget, run, and written back in input order, then checkpointed (glassbox.service.bulk.output). Memory holds one window,
however large the input.

Exit status: 0 when every input was classified (or skipped into --errors under --on-error skip); 1 when the run
could not start (unreadable input, missing column, bad model) or stopped at a bad line (the checkpoint lets --resume
go on from that line once it is fixed); 130 when interrupted (the same); 141, silently, when stdout's reader stops
early (`| head`).
"""

from __future__ import annotations

import argparse
import itertools
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from glassbox.service.bulk.classifier import ROUTE, Classifier
from glassbox.service.bulk.output import (
    AlreadyDone,
    ResumeError,
    RowEncoder,
    Sink,
    check_paths,
    encode_errors,
    output_delimiter,
    output_format,
)
from glassbox.service.bulk.progress import Progress
from glassbox.service.bulk.readers import Fields, Source, detect_format, read_input
from glassbox.service.bulk.records import BadItem, Input, Item
from glassbox.service.errors import GlassboxError
from glassbox.service.observer import Observer, RequestRecord

EMPTY_TEXT = "the text or its pair is empty: there is nothing to classify (the HTTP routes refuse it too)"
# Bad lines printed to stderr one by one; past this only counted (the --errors file has them all).
SHOWN_ERRORS = 20


@dataclass(slots=True)
class Outcome:
    """What one window came to."""

    rows: bytes
    errors: bytes
    bad: list[BadItem]
    done: int  # inputs finished, counted from the start of the input
    stop: BadItem | None = None  # the bad input that ends the run


@dataclass(slots=True)
class Tally:
    bad: int = 0
    shown: int = 0
    codes: dict[str, int] = field(default_factory=dict)


def windows(records: Iterator[Input], size: int, skip: int) -> Iterator[list[Input]]:
    """Inputs in lists of `size`, after the first `skip` (already done by the run being resumed). Raises ResumeError
    when the input ends before `skip` inputs: it is not the input whose inputs the checkpoint counted."""
    pending = records
    if skip:
        count = 0  # positions count every input from 0, one by one
        for record in records:
            count = record.position + 1
            if record.position >= skip:
                pending = itertools.chain([record], records)
                break
        if count < skip:
            raise ResumeError(f"the input holds {count} inputs, but the checkpoint counts {skip} done: it is not the "
                              "input the run began with (or it shrank); start a new run")
    while True:
        window = list(itertools.islice(pending, size))
        if not window:
            return
        yield window


class WindowRunner:
    """One window: tokenize, refuse over-long texts under --oversize reject, classify, encode rows and errors."""

    def __init__(self, classifier: Classifier, encoder: RowEncoder, *, reject_oversize: bool, stop_on_error: bool,
                 observer: Observer) -> None:
        self.classifier = classifier
        self.encoder = encoder
        self.reject_oversize = reject_oversize
        self.stop_on_error = stop_on_error
        self.observer = observer

    def __call__(self, window: list[Input]) -> Outcome:
        items = [r for r in window if isinstance(r, Item) and r.text and r.pair != ""]
        bad = [r if isinstance(r, BadItem) else BadItem(r.position, r.line, "empty_input", EMPTY_TEXT)
               for r in window if not isinstance(r, Item) or not r.text or r.pair == ""]
        start = time.perf_counter_ns()
        tokens = self.classifier.tokenize([i.text for i in items], _pairs(items))
        tokenized = time.perf_counter_ns()
        if self.reject_oversize and bool(tokens.truncated.any()):
            limit = self.classifier.tokenizer.max_length
            bad += [BadItem(items[i].position, items[i].line, "text_too_long",
                            f"longer than the {limit}-token limit (--max-length) and --oversize is reject")
                    for i in np.flatnonzero(tokens.truncated).tolist()]
            bad.sort(key=lambda b: b.position)
        done = window[-1].position + 1
        stop = next((b for b in bad if b.fatal or self.stop_on_error), None)
        if stop is not None:
            # Everything before the stopping input is finished and kept; it and all after are not done.
            done = stop.position
            bad = [b for b in bad if b.position < stop.position or b is stop]
        bad_positions = {b.position for b in bad}
        keep = [i for i, item in enumerate(items) if item.position < done and item.position not in bad_positions]
        if len(keep) < len(items):
            tokens = tokens.select(keep)
            items = [items[i] for i in keep]
        result = self.classifier.run(tokens, tokenize_ns=(start, tokenized))
        for b in bad:
            self.observer.on_request(RequestRecord(
                request_id=f"line-{b.line}", route=ROUTE, method="RUN", status=400, error_code=b.code,
                start_ns=start, end_ns=start))
        # The stopping input is not done (--resume reads it again), so it is not in the errors file either, whatever
        # --on-error: recorded there, it would stay after a resume had classified it.
        recorded = [b for b in bad if b is not stop]
        return Outcome(self.encoder.encode(items, self.classifier.columns(result)), encode_errors(recorded), bad, done,
                       stop)


def _pairs(items: list[Item]) -> list[str | None] | None:
    pairs = [i.pair for i in items]
    return pairs if any(p is not None for p in pairs) else None


def _observer(args: argparse.Namespace) -> tuple[Observer | None, Any]:
    """With --metrics-port: the server's metrics and their observer, served over HTTP while the run goes."""
    if args.metrics_port is None:
        return None, None
    from prometheus_client import start_http_server

    from glassbox.telemetry.metrics import build_metrics, new_registry
    from glassbox.telemetry.observer import MetricsObserver

    registry = new_registry()  # start_http_server takes ?name[]= too
    observer = MetricsObserver(build_metrics(registry), routes=(ROUTE,))
    server, _ = start_http_server(args.metrics_port, registry=registry)
    return observer, server


def _fields(args: argparse.Namespace) -> Fields:
    required = tuple(name for name in (args.pair_field, args.id_field) if name is not None)
    return Fields(text=args.text_field, pair=args.pair_field or "text_pair", id=args.id_field or "id",
                  required=required)


def _input_name(path: str) -> str:
    """The input as the checkpoint names it: a file by its real path; a pipe (`<(zcat x.gz)`: /dev/fd/63, which
    resolves to a new pipe:[inode] each run) by the path given, made absolute."""
    if path == "-":
        return path
    return str(Path(path).resolve() if Path(path).is_file() else Path(path).absolute())


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def execute(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    for name in ("window", "batch_tokens", "max_batch_size", "max_length"):
        if getattr(args, name) < 1:
            return _fail(f"--{name.replace('_', '-')} must be at least 1")
    if args.quantize == "int8" and args.device == "cuda":
        return _fail("int8 runs on the CPU only")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        return _fail(f"--metrics-port must be 0..65535 (got {args.metrics_port})")
    try:
        fmt = detect_format(args.input, args.format)
        out_format = output_format(args.out, args.out_format)
        check_paths({"--out": None if args.out == "-" else Path(args.out), "--errors": args.errors,
                     "--summary": args.summary}, None if args.input == "-" else Path(args.input))
        source = read_input(args.input, fmt, _fields(args), delimiter=args.delimiter, stdin=sys.stdin.buffer)
    except GlassboxError as exc:
        return _fail(exc.message)
    try:
        observer, server = _observer(args)
    except OSError as exc:  # the port is taken, or not ours to bind
        return _fail(f"cannot serve metrics on --metrics-port {args.metrics_port}: {exc.strerror or exc}")
    try:
        classifier = Classifier(
            args.model, device=args.device, quantize=args.quantize, cpu_dtype=args.dtype, max_length=args.max_length,
            max_batch_size=args.max_batch_size, batch_tokens=args.batch_tokens, threads=args.threads,
            engine_threads=args.engine_threads, all_scores=args.all_scores, observer=observer)
    except (GlassboxError, ValueError) as exc:
        if server is not None:
            server.shutdown()  # the port is free again for the next run of an embedding process (tests)
        return _fail(getattr(exc, "message", str(exc)))
    out = None if args.out == "-" else Path(args.out)
    # "records": how inputs are counted; a text file's empty lines stopped being records on 2026-12-07, so a checkpoint
    # from before (without the key) is refused rather than resumed at the wrong line.
    identity = {"input": _input_name(args.input), "format": fmt, "records": "v2",
                "output_format": out_format, "errors": str(args.errors) if args.errors else None,
                "all_scores": args.all_scores, "fields": [args.text_field, args.pair_field, args.id_field],
                "delimiter": args.delimiter,
                # What the scores come from: a resumed run's rows after the checkpoint must be the same model's.
                "model": str(classifier.model_dir.resolve()), "quantize": args.quantize,
                "engine": classifier.engine.kind,
                "max_length": classifier.tokenizer.max_length}
    sink = Sink(out, args.errors, identity, stdout=sys.stdout.buffer)
    encoder = RowEncoder(out_format, classifier.labels, regression=classifier.problem == "regression",
                         all_scores=args.all_scores, delimiter=output_delimiter(args.out))
    runner = WindowRunner(classifier, encoder, reject_oversize=args.oversize == "reject",
                          stop_on_error=args.on_error == "stop", observer=classifier.observer)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _classify(args, source, sink, runner, encoder, started)
    finally:
        signal.signal(signal.SIGTERM, previous)
        classifier.close()
        if server is not None:
            server.shutdown()


def _classify(args: argparse.Namespace, source: Source, sink: Sink, runner: WindowRunner, encoder: RowEncoder,
              started: float) -> int:
    try:
        done = sink.open(args.resume, encoder.header())
    except AlreadyDone as exc:
        print(f"glassbox classify: {exc}; nothing to do", file=sys.stderr)
        return 0
    except BrokenPipeError:
        raise  # glassbox.service.cli.main ends quietly (exit 141) when it is stdout that nobody reads any more
    except (GlassboxError, OSError) as exc:
        return _fail(getattr(exc, "message", str(exc)))
    if done:
        print(f"glassbox classify: resuming after {done} inputs", file=sys.stderr)
    tally = Tally()
    stats = runner.classifier.stats
    running = time.perf_counter()
    show = sys.stderr.isatty() if args.progress is None else args.progress
    try:
        with Progress(source.size, enabled=show) as progress:
            for window in windows(source.records, args.window, done):
                outcome = runner(window)
                sink.write(outcome.rows, outcome.errors)
                sink.commit(outcome.done)
                _report(outcome.bad, tally, args.input)
                progress.update(source.tell(), stats.texts)
                if outcome.stop is not None:
                    sink.abandon()
                    return _stopped(outcome.stop, args, stats.texts)
    except KeyboardInterrupt:
        sink.abandon()
        print(f"glassbox classify: interrupted; run again with --resume to go on from the last checkpoint "
              f"({stats.texts} texts classified in this run)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output to stdout whose reader stopped (`| head`): glassbox.service.cli.main exits quietly with SIGPIPE's
        # status when stdout is the broken pipe, as Unix tools do, and reports anything else.
        sink.abandon()
        raise
    except ResumeError as exc:
        sink.abandon()
        return _fail(exc.message)
    except (GlassboxError, OSError) as exc:
        sink.abandon()
        return _fail(f"{getattr(exc, 'message', exc)} (the output so far is kept: --resume goes on from it)")
    try:
        sink.finish()
    except OSError as exc:
        sink.abandon()
        return _fail(f"cannot put the output in place: {exc} (run again with --resume to finish)")
    now = time.perf_counter()
    return _summary(args, runner, tally, now - started, now - running)


def _report(bad: list[BadItem], tally: Tally, source: str) -> None:
    for item in bad:
        tally.bad += 1
        tally.codes[item.code] = tally.codes.get(item.code, 0) + 1
        if tally.shown < SHOWN_ERRORS:
            tally.shown += 1
            print(f"glassbox classify: {item.describe(source)}", file=sys.stderr)


def _stopped(stop: BadItem, args: argparse.Namespace, texts: int) -> int:
    where = f"{args.input}:{stop.line}"
    if stop.fatal:
        print(f"glassbox classify: stopped at {where}: the rest of the input cannot be read", file=sys.stderr)
    else:
        print(f"glassbox classify: stopped at the bad input {where} (--on-error stop); {texts} texts before it are "
              f"written. Fix it and run again with --resume, or pass --on-error skip", file=sys.stderr)
    return 1


def _summary(args: argparse.Namespace, runner: WindowRunner, tally: Tally, elapsed: float, running: float) -> int:
    """`seq_per_s`: texts over the time from the first read to the last write (the model loaded and warm);
    `engine_seq_per_s`: over the engine stage alone; `seconds`: the whole command, model loading included."""
    stats = runner.classifier.stats
    summary = {
        "texts": stats.texts, "tokens": stats.tokens, "truncated": stats.truncated, "errors": tally.bad,
        "error_codes": tally.codes, "batches": stats.batches, "seconds": round(elapsed, 3),
        "run_seconds": round(running, 3),
        "seq_per_s": round(stats.texts / running, 1) if running else 0.0,
        "engine_seq_per_s": round(stats.texts / stats.infer_s, 1) if stats.infer_s else 0.0,
        "padding_ratio": round(stats.padding_ratio, 4), "device": ",".join(sorted(stats.devices)),
        "engine": runner.classifier.engine.kind, "engine_threads": runner.classifier.engine_threads,
        "output": args.out,
    }
    errors = f" ({args.errors})" if args.errors and tally.bad else ""
    print(f"glassbox classify: {stats.texts} texts, {stats.tokens} tokens, {stats.truncated} truncated, "
          f"{tally.bad} errors{errors}; {summary['seq_per_s']} seq/s ({summary['engine_seq_per_s']} in the engine "
          f"stage), {elapsed:.1f} s with loading; padding {summary['padding_ratio']:.1%}; engine {summary['engine']}",
          file=sys.stderr)
    if args.summary is not None:
        import json

        try:
            args.summary.parent.mkdir(parents=True, exist_ok=True)
            args.summary.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:  # the results are in place; only the summary is lost
            return _fail(f"cannot write the summary to {args.summary}: {exc.strerror or exc}")
    return 0


def _fail(message: str) -> int:
    print(f"glassbox classify: {message}", file=sys.stderr)
    return 1
