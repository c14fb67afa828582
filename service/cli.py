"""`glassbox` command line. A composition root: it may wire service, telemetry and chaos together.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`. Only the module of
the command being run is imported, so `glassbox serve` never loads the load generator (httpx), the plots
(matplotlib) or the training code: the parser is built with every command's name and help, and the options of the
one command named on the command line.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from glassbox.service.version import version

# (words, module, one-line help). A command may also have subcommands (`bench` and `bench engine`): then its own
# options work without one, and naming one runs that instead.
COMMANDS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("serve",), "glassbox.service.server", "serve a model over HTTP"),
    (("model", "build"), "glassbox.service.model.build", "fine-tune and write the built-in default model"),
    (("model", "info"), "glassbox.service.model.info", "describe a model directory (default: the built-in model)"),
    (("model", "inspect"), "glassbox.service.model.inspection",
     "family, head, labels, max length and parameters of a model directory; whether it is servable, and why not"),
    (("model", "reference"), "glassbox.service.model.reference",
     "count what a model answers on texts like those it should see (reference.json), for the server's drift figures"),
    (("model", "convert"), "glassbox.service.model.convert",
     "pytorch_model.bin -> model.safetensors, read with torch.load(weights_only=True)"),
    (("bench",), "glassbox.chaos.cli.bench", "open-loop HTTP load against a running server (see also: bench engine)"),
    (("bench", "engine"), "glassbox.service.bench.engine", "offline engine throughput, latency and accuracy"),
    (("classify",), "glassbox.service.bulk.cli", "classify a file of texts (JSON lines, CSV, text, frames) offline"),
    (("chaos", "run"), "glassbox.chaos.cli.run", "run a chaos experiment (YAML) against a server and judge it"),
    (("chaos", "slow-clients"), "glassbox.chaos.cli.slow_clients",
     "slow-client attack on your own server: trickled headers or bodies, or slow readers"),
)
MODULES = {words: module for words, module, _ in COMMANDS}


def named_command(argv: Sequence[str]) -> tuple[str, ...]:
    """The longest run of leading words that names a command (`["bench", "engine", "--json"]` -> bench engine);
    () when none does. Options end the run: the top-level parser takes none but --help."""
    words: tuple[str, ...] = ()
    for arg in argv:
        longer = (*words, arg)
        if arg.startswith("-") or not any(known[: len(longer)] == longer for known in MODULES):
            break
        words = longer
    return words if words in MODULES else ()


def build_parser(load: tuple[str, ...] = (),
                 parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every command with its help; the options (and the `run`) only of the command `load` and of the commands it
    is a subcommand of (`bench` for `bench engine`), imported here."""
    parser = parser_class(prog="glassbox", description="glassbox: an inference server that hides nothing")
    parser.add_argument("--version", action="version", version=f"glassbox {version()}",
                        help="print the installed version (what glassbox_build_info and /info report) and exit")
    runnable = set(MODULES)
    helps = {words: help_text for words, _, help_text in COMMANDS}
    parsers: dict[tuple[str, ...], argparse.ArgumentParser] = {(): parser}
    groups: dict[tuple[str, ...], argparse._SubParsersAction[argparse.ArgumentParser]] = {}

    def parser_for(words: tuple[str, ...]) -> argparse.ArgumentParser:
        if words not in parsers:
            parent = words[:-1]
            if parent not in groups:
                # Subcommands are required only under a word that does nothing by itself.
                groups[parent] = parser_for(parent).add_subparsers(
                    dest="_".join(parent) or "command", metavar="COMMAND", required=parent not in runnable)
            help_text = helps.get(words, f"{words[-1]} commands")
            parsers[words] = groups[parent].add_parser(words[-1], help=help_text, description=help_text)
        return parsers[words]

    for words in MODULES:
        command = parser_for(words)
        command.set_defaults(_command=words, _parser=command)
        if load[: len(words)] == words:
            module = importlib.import_module(MODULES[words])
            module.add_arguments(command)
            command.set_defaults(_run=module.run)
    return parser


def parsed_command(args: argparse.Namespace) -> tuple[str, ...]:
    command: tuple[str, ...] = getattr(args, "_command", ())
    return command


class _ProbeFailed(Exception):
    pass


class _ProbeParser(argparse.ArgumentParser):
    """A parser that raises where argparse would print an error and exit: the probe below must stay silent."""

    def error(self, message: str) -> NoReturn:
        raise _ProbeFailed(message)


def probed_command(argv: Sequence[str], wanted: tuple[str, ...]) -> tuple[str, ...]:
    """The command argparse itself finds in `argv`. It differs from `wanted` only when options come before a
    subcommand's name (`bench --rate 3 engine`); `wanted` when the line does not parse, so that the real parser
    reports the error, and --help is left out so that it shows the command that will run."""
    quiet = [arg for arg in argv if arg not in ("-h", "--help")]
    try:
        return parsed_command(build_parser(wanted, _ProbeParser).parse_known_args(quiet)[0]) or wanted
    except _ProbeFailed:
        return wanted


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    wanted = named_command(argv)
    try:
        return _main(argv, wanted)
    except KeyboardInterrupt:
        # Ctrl-C before a command has signal handling of its own (importing torch, loading the model, warming up):
        # the traceback would be hundreds of lines of torch's import machinery and say nothing. Commands that handle
        # SIGINT themselves (serve's drain, chaos run's rollbacks) never let it reach here once they run.
        print(f"{' '.join(('glassbox', *wanted))}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


def _main(argv: list[str], wanted: tuple[str, ...]) -> int:
    parser = build_parser(probed_command(argv, wanted))
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's own usage, not the top level's: `glassbox serve --max-batchsize 8` names serve's flags
        getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        code: int = args._run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        if not _stdout_broken():
            raise  # a socket or another pipe the command used: a real failure, not the end of the output
        # Whoever read the output stopped early (`glassbox model inspect DIR --json | head`): stop quietly, as Unix
        # tools do, with SIGPIPE's status. stdout goes to /dev/null so that the interpreter's own flush at exit cannot
        # fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return code


def _stdout_broken() -> bool:
    """Whether nobody reads stdout any more (a pipe whose reader closed reports an error on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no real file behind stdout, or no poll here
        return False


if __name__ == "__main__":
    sys.exit(main())
