"""Who may call which route: the API key (glassbox.service.http.auth) and CORS (glassbox.service.http.cors), applied to
the app's final route list by the composition root. Read at start-up, so a bad key file stops the server before it
listens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from starlette.routing import BaseRoute

from glassbox.service.http.auth import BearerKey, load_api_key, protect
from glassbox.service.http.cors import CorsPolicy
from glassbox.service.observer import Observer
from glassbox.service.settings import ApiKeyScope, Settings


@dataclass(frozen=True, slots=True)
class Access:
    key: BearerKey | None
    scope: ApiKeyScope
    cors: CorsPolicy | None

    @classmethod
    def from_settings(cls, settings: Settings) -> Access:
        key = load_api_key(settings)
        cors = CorsPolicy.parse(settings.cors_allow_origin)
        return cls(BearerKey(key) if key else None, settings.api_key_scope, cors)

    def apply(self, routes: Sequence[BaseRoute], observer: Observer) -> list[BaseRoute]:
        """The key inside, CORS outside: a 401 carries the CORS headers a browser needs to read it. Refusals go to
        `observer` as requests answered 401."""
        guarded = protect(routes, self.key, self.scope, observer) if self.key is not None else list(routes)
        return self.cors.apply(guarded) if self.cors is not None else guarded
