"""The chaos control API's bearer token, read and checked from the settings: a module of its own, without the fault
machinery (and torch), so the supervisor of the multi-process layout can check it before anything starts."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from chaos.client import TOKEN_ENV
from service.errors import ConfigurationError
from service.settings import Settings

log = logging.getLogger("glassbox.chaos")

SHORT_TOKEN = 16


def load_token(settings: Settings, environ: Mapping[str, str]) -> str:
    """The chaos token, or ConfigurationError saying what is missing or wrong. A file's trailing newline is not part
    of the token; giving it both ways is refused, so nobody wonders which one the server took."""
    from_env = environ.get(TOKEN_ENV, "").rstrip("\r\n")
    path = settings.chaos_token_file
    if path and from_env:
        raise ConfigurationError(f"the chaos token is given twice ({TOKEN_ENV} and --chaos-token-file); give one")
    if path:
        try:
            token = Path(path).expanduser().read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"--chaos-token-file {path}: cannot read it ({exc})") from None
        if not token:
            raise ConfigurationError(f"--chaos-token-file {path} is empty; put the chaos token in it")
    elif from_env:
        token = from_env
    else:
        raise ConfigurationError(
            f"--chaos needs a bearer token for the control API: set {TOKEN_ENV} or pass --chaos-token-file PATH")
    if not all("!" <= char <= "~" for char in token):
        raise ConfigurationError("the chaos token must be printable ASCII without spaces (it travels in a header)")
    if len(token) < SHORT_TOKEN:
        log.warning("the chaos token is shorter than %d characters; use a long random one", SHORT_TOKEN)
    return token
