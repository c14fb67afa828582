"""Grafana annotations at inject and rollback, so the dashboards show when a fault was on.

An annotation that cannot be posted is logged and reported back as False; it never fails or delays the experiment
by more than its short timeout."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import httpx

log = logging.getLogger("glassbox.chaos.grafana")

TOKEN_ENV = "GLASSBOX_GRAFANA_TOKEN"
TIMEOUT_S = 3.0


class GrafanaAnnotator:
    def __init__(self, url: str, token: str | None = None, *, timeout_s: float = TIMEOUT_S,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url.rstrip("/") + "/api/annotations"
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.timeout_s = timeout_s
        self.transport = transport

    async def annotate(self, wall_s: float, tags: Sequence[str], text: str, end_wall_s: float | None = None) -> str:
        """Posts one annotation; returns "" on success, else why it failed (already logged)."""
        body: dict[str, object] = {"time": int(wall_s * 1000), "tags": list(tags), "text": text}
        if end_wall_s is not None:
            body["timeEnd"] = int(end_wall_s * 1000)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, transport=self.transport, trust_env=False) as client:
                response = await client.post(self.url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            problem = f"{type(exc).__name__}: {exc}"
        else:
            if 200 <= response.status_code < 300:
                return ""
            problem = f"HTTP {response.status_code}: {response.text[:200]}"
        log.warning("grafana annotation failed (%s): %s", self.url, problem)
        return problem
