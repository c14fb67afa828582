"""`glassbox` command line. A composition root: it may wire service, telemetry and chaos together.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# (words, module, one-line help)
COMMANDS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("serve",), "service.server", "serve a model over HTTP"),
    (("model", "build"), "service.model.build", "fine-tune and write the built-in default model"),
    (("model", "info"), "service.model.info", "describe a model directory (default: the built-in model)"),
    (("bench", "engine"), "service.bench.engine", "offline engine throughput, latency and accuracy"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="glassbox", description="glassbox: an inference server that hides nothing")
    groups: dict[tuple[str, ...], argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    groups[()] = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for words, module_name, help_text in COMMANDS:
        for depth in range(1, len(words)):
            prefix = words[:depth]
            if prefix not in groups:
                sub = groups[prefix[:-1]].add_parser(prefix[-1], help=f"{prefix[-1]} commands")
                groups[prefix] = sub.add_subparsers(dest="_".join(prefix), metavar="COMMAND", required=True)
        command = groups[words[:-1]].add_parser(words[-1], help=help_text, description=help_text)
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
