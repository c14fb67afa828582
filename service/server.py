"""`glassbox serve`: the flags (one per Settings field, in groups), then the start-up both layouts share (settings,
logging, the open-file limit) and the layout's own `run`: serving/one_process.py (`--workers 0`) or
serving/supervisor.py (HTTP worker processes and an engine process). The HTTP server itself, with its drain, is
serving/http_server.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import Any

from glassbox.service.cores import serial_main_thread
from glassbox.service.errors import GlassboxError
from glassbox.service.secret_flag import add_secret_flag
from glassbox.service.serving.http_server import raise_open_file_limit
from glassbox.service.settings import (
    ENV_PREFIX,
    ListError,
    Settings,
    choices_for,
    field_names,
    load_settings,
    parse_int_list,
    sources,
    unknown_variables,
)
from glassbox.service.settings_help import GROUPS

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
log = logging.getLogger("glassbox")


# --- flags ----------------------------------------------------------------------------------------------------------
def _int_list(raw: str) -> tuple[int, ...]:
    try:
        return parse_int_list(raw)
    except ListError as error:  # argparse puts the flag's name in front of the message
        raise argparse.ArgumentTypeError(str(error)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per Settings field, in the groups of settings_help.GROUPS, except secrets: those come from their
    GLASSBOX_* variable or a file only (a flag value shows in `ps`), and the flag that would take one is refused with
    a line that says so. Defaults are None so that only flags the user gave override GLASSBOX_* vars. The help shows
    the value in effect without the flag: a `GLASSBOX_*` variable's (and names it), else the default."""
    parser.usage = f"{parser.prog} [options]"  # the groups below list them; the full usage was 60 lines
    parser.epilog = ("Every flag is also a GLASSBOX_* variable (a flag wins). docs/settings.md lists each setting with "
                     "the details its line here leaves out.")
    effective = sources()
    specs = {spec.name: spec for spec in dataclasses.fields(Settings)}
    for title, about, names in GROUPS:
        group = parser.add_argument_group(title, about)
        for name in names:
            _add_flag(group, specs[name], effective[name])


def _add_flag(group: argparse._ArgumentGroup, spec: dataclasses.Field[Any], effective: tuple[str, str]) -> None:
    flag = "--" + spec.name.replace("_", "-")
    default = spec.default
    variable = f"{ENV_PREFIX}{spec.name.upper()}"
    if spec.metadata.get("secret"):
        add_secret_flag(group, flag, variable, f"{flag}-file")
        return
    value, source = effective
    help_text = f"{spec.metadata['help']} (env {variable}"
    if source != "default":
        help_text += f", now: {value} from {variable})"
    else:
        help_text += f", default: {value})" if value != "" else ")"
    help_text = help_text.replace("%", "%%")  # argparse formats help strings with %
    if isinstance(default, bool):
        group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
    elif isinstance(default, tuple):
        group.add_argument(flag, type=_int_list, default=None, metavar="N,N,...", help=help_text)
    elif isinstance(default, int | float):
        group.add_argument(flag, type=type(default), default=None, metavar=spec.name.upper(), help=help_text)
    else:
        choices = LOG_LEVELS if spec.name == "log_level" else choices_for(spec.name)
        group.add_argument(flag, default=None, choices=choices, help=help_text)


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides = {name: getattr(args, name, None) for name in field_names()}
    return load_settings({name: value for name, value in overrides.items() if value is not None})


# --- the command ----------------------------------------------------------------------------------------------------
def _workers(settings: Settings) -> int:
    """0 for the one-process layout, else the number of HTTP worker processes (the `workers` setting)."""
    if settings.workers != "auto":
        return int(settings.workers)
    from glassbox.service.engines.factory import choose_device
    from glassbox.service.serving.layout import resolve_workers

    try:
        device = choose_device(settings.device).device
    except GlassboxError:
        device = "cpu"  # the engine reports the unavailable device itself, with its own message
    return resolve_workers(settings.workers, device)


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"glassbox serve: {exc}", file=sys.stderr)
        return 2
    if settings.log_level.lower() not in LOG_LEVELS:
        print(f"glassbox serve: log level must be one of {', '.join(LOG_LEVELS)}", file=sys.stderr)
        return 2
    # Before anything imports torch: the process that runs the engine keeps its main thread's OpenMP team empty (the
    # engine process of --workers inherits this through its environment).
    serial_main_thread()
    from glassbox.service.serving.wiring import configure_logging  # imported here: keeps other commands light

    workers = _workers(settings)
    # Before the app is built, so the model-loading and start-up lines already go out in this format and level.
    configure_logging(settings, process="supervisor" if workers else "")
    for warning in unknown_variables():
        log.warning("%s", warning)
    raise_open_file_limit()
    if workers:
        from glassbox.service.serving import supervisor

        return supervisor.run(settings, workers)
    from glassbox.service.serving import one_process

    return one_process.run(settings)
