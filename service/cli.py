"""`glassbox` command line. A composition root: it may wire service, telemetry and chaos together.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# (words, module, one-line help). A command may also have subcommands (`bench` and `bench engine`): then its own
# options work without one, and naming one runs that instead.
COMMANDS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("serve",), "service.server", "serve a model over HTTP"),
    (("model", "build"), "service.model.build", "fine-tune and write the built-in default model"),
    (("model", "info"), "service.model.info", "describe a model directory (default: the built-in model)"),
    (("model", "inspect"), "service.model.inspection",
     "family, head, labels, max length and parameters of a model directory; whether it is servable, and why not"),
    (("model", "convert"), "service.model.convert",
     "pytorch_model.bin -> model.safetensors, read with torch.load(weights_only=True)"),
    (("bench",), "chaos.cli.bench", "open-loop HTTP load against a running server (see also: bench engine)"),
    (("bench", "engine"), "service.bench.engine", "offline engine throughput, latency and accuracy"),
    (("classify",), "service.bulk.cli", "classify a file of texts (JSON lines, CSV, text, frames) offline"),
    (("chaos", "run"), "chaos.cli.run", "run a chaos experiment (YAML) against a server and judge it"),
    (("chaos", "slow-clients"), "chaos.cli.slow_clients",
     "slow-client attack on your own server: trickled headers or bodies, or slow readers"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="glassbox", description="glassbox: an inference server that hides nothing")
    runnable = {words for words, _, _ in COMMANDS}
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

    for words, module_name, _ in COMMANDS:
        command = parser_for(words)
        module = importlib.import_module(module_name)
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args._run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
