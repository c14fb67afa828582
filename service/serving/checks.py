"""What the children of the multi-process layout read from the settings at start and could fail on, checked once in
the supervisor before anything starts: the API key file and the CORS origins (every worker builds them), with
--profiling the profile token (every worker reads it), and with --chaos the chaos token (the engine process loads
it). A bad one is then one line and exit code 1, as in the
one-process layout, instead of children that fail one after another."""

from __future__ import annotations

import os

from glassbox.service.http.access import Access
from glassbox.service.settings import Settings


def check_start_settings(settings: Settings) -> None:
    """Raises the GlassboxError (ConfigurationError) the children would raise."""
    Access.from_settings(settings)
    if settings.profiling:
        from glassbox.service.http.profile import allow_tracing, load_profile_token

        load_profile_token(settings, os.environ)
        allow_tracing()  # the supervisor is the root of what a worker's py-spy records
    if settings.chaos:
        from glassbox.chaos.token import load_token  # the token alone: the fault machinery would bring torch along

        load_token(settings, os.environ)
