"""ChaosClient: the chaos control API from Python (the experiment runner arms and rolls back faults with it).

    async with ChaosClient("http://127.0.0.1:8000", token) as chaos:
        fault = await chaos.arm({"fault": "latency", "ttl_s": 60, "delay_ms": 50})
        ...
        await chaos.disarm(fault["id"])

Every failure is a ChaosClientError: a non-2xx answer carries the server's status and error code; a request that
got no answer at all (refused, reset, timed out) has status 0 and code "transport".
"""

from __future__ import annotations

from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

# Where the server reads its chaos token, and where the runner and the local server it starts pass theirs.
TOKEN_ENV = "GLASSBOX_CHAOS_TOKEN"


class ChaosClientError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}" if status else f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class ChaosClient:
    """An async context manager over one httpx connection pool. `transport` is for tests (httpx.MockTransport)."""

    def __init__(self, base_url: str, token: str | None, timeout_s: float = 10.0, *,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.has_token = bool(token)  # a 401 then means a wrong token, not a missing one
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s,
                                       transport=transport)

    async def __aenter__(self) -> ChaosClient:
        await self._http.__aenter__()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        await self._http.__aexit__(kind, error, trace)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def arm(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Arm a fault; returns the armed fault object (its `id` disarms it)."""
        fault: dict[str, Any] = await self._call("POST", "/chaos/faults", json=spec)
        return fault

    async def faults(self) -> list[dict[str, Any]]:
        """The faults still armed."""
        body = await self._call("GET", "/chaos/faults")
        return list(body["faults"])

    async def disarm(self, fault_id: str) -> list[dict[str, Any]]:
        """Disarm one fault; ChaosClientError 404 chaos_fault_not_found when it is gone (expired, disarmed)."""
        body = await self._call("DELETE", f"/chaos/faults/{quote(fault_id, safe='')}")
        return list(body["disarmed"])

    async def disarm_all(self) -> list[dict[str, Any]]:
        body = await self._call("DELETE", "/chaos/faults")
        return list(body["disarmed"])

    async def _call(self, method: str, path: str, json: dict[str, Any] | None = None) -> Any:
        try:
            response = await self._http.request(method, path, json=json)
        except httpx.HTTPError as exc:
            raise ChaosClientError(0, "transport", f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if response.is_success:
            try:
                return response.json()
            except ValueError as exc:
                raise ChaosClientError(response.status_code, "invalid_response",
                                       f"{method} {path}: the answer is not JSON") from exc
        raise _error_of(response, method, path)


def _error_of(response: httpx.Response, method: str, path: str) -> ChaosClientError:
    """The server's error body when it sent one; otherwise what there is (a proxy's HTML page, nothing)."""
    try:
        error = response.json()["error"]
        return ChaosClientError(response.status_code, str(error["code"]), str(error["message"]))
    except (ValueError, KeyError, TypeError):
        text = " ".join(response.text.split())[:200]
        return ChaosClientError(response.status_code, f"http_{response.status_code}",
                                f"{method} {path}: {text or response.reason_phrase}")
