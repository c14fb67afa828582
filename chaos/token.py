"""The chaos control API's bearer token, read and checked from the settings: a module of its own, without the fault
machinery (and torch), so the supervisor of the multi-process layout can check it before anything starts."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from glassbox.chaos.client import TOKEN_ENV
from glassbox.service.errors import ConfigurationError
from glassbox.service.http.auth import read_token
from glassbox.service.settings import Settings

log = logging.getLogger("glassbox.chaos")

SHORT_TOKEN = 16


def load_token(settings: Settings, environ: Mapping[str, str]) -> str:
    """The chaos token, or ConfigurationError saying what is missing or wrong. A file's trailing newline is not part
    of the token; giving it both ways is refused, so nobody wonders which one the server took."""
    token = read_token("chaos token", TOKEN_ENV, "--chaos-token-file", settings.chaos_token_file, environ)
    if not token:
        raise ConfigurationError(
            f"--chaos needs a bearer token for the control API: set {TOKEN_ENV} or pass --chaos-token-file PATH")
    if len(token) < SHORT_TOKEN:
        log.warning("the chaos token is shorter than %d characters; use a long random one", SHORT_TOKEN)
    return token
