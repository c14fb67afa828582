"""A flag that would take a secret on the command line, refused: `ps` shows every process's arguments to every user
of the host, so tokens and keys come from an environment variable or a file only. The flag stays known (hidden from
--help) so that using it says where the secret goes instead, rather than argparse's "unrecognized arguments"."""

from __future__ import annotations

import argparse
from typing import Any


class SecretFlag(argparse.Action):
    """`--token VALUE` -> exit 2: "--token takes no value on the command line ...: set VARIABLE or pass FILE_FLAG"."""

    def __init__(self, *args: Any, variable: str, file_flag: str, **kwargs: Any) -> None:
        self.variable = variable
        self.file_flag = file_flag
        kwargs.setdefault("nargs", "?")
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(f"{option_string} takes no value on the command line, where ps shows it to every user: set "
                     f"{self.variable} or pass {self.file_flag} PATH")


def add_secret_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str, variable: str,
                    file_flag: str) -> None:
    parser.add_argument(flag, action=SecretFlag, variable=variable, file_flag=file_flag, default=None,
                        dest=flag.lstrip("-").replace("-", "_"))
