"""ChaosClient against a live uvicorn server with --chaos (a FakeEngine behind it), and against an httpx
MockTransport for answers a glassbox server never gives (a proxy's HTML error page)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from glassbox.chaos.client import TOKEN_ENV, ChaosClient, ChaosClientError
from glassbox.service.app import create_app
from tests.service.apptools import BOUND_S, FakeEngine, app_settings, live_server, wait_ready

TOKEN = "chaos-token-for-tests-0123456789"
T = TypeVar("T")


def run(work: Awaitable[T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(work, BOUND_S)

    return asyncio.run(bounded())


@pytest.fixture(scope="module")
def base_url(tiny_model_dir: Path) -> Iterator[str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TOKEN_ENV, TOKEN)
        settings = app_settings(tiny_model_dir, chaos=True)
        app = create_app(settings, engine=FakeEngine())
    with live_server(app, settings) as server:
        wait_ready(lambda path: httpx.get(server.base_url + path))
        yield server.base_url


def test_arm_list_disarm_round_trip(base_url: str) -> None:
    async def scenario() -> None:
        async with ChaosClient(base_url, TOKEN) as chaos:
            latency = await chaos.arm({"fault": "latency", "ttl_s": 60, "delay_ms": 1})
            error = await chaos.arm({"fault": "error", "ttl_s": 60, "fraction": 0.0})
            assert latency["fault"] == "latency" and latency["params"]["delay_ms"] == 1.0
            assert [f["id"] for f in await chaos.faults()] == [latency["id"], error["id"]]
            assert [f["id"] for f in await chaos.disarm(latency["id"])] == [latency["id"]]
            assert [f["id"] for f in await chaos.disarm_all()] == [error["id"]]
            assert await chaos.faults() == []

    run(scenario())


def test_server_errors_become_chaos_client_errors_with_status_and_code(base_url: str) -> None:
    async def scenario() -> list[tuple[int, str, str]]:
        seen = []
        async with ChaosClient(base_url, TOKEN) as chaos:
            for call in (chaos.disarm("no such fault"), chaos.arm({"fault": "oom", "ttl_s": -1}),
                         chaos.arm({"fault": "fragmentation", "ttl_s": 5, "inactive_mib": 8})):
                with pytest.raises(ChaosClientError) as caught:
                    await call
                seen.append((caught.value.status, caught.value.code, caught.value.message))
        async with ChaosClient(base_url, "wrong-token") as stranger:
            with pytest.raises(ChaosClientError) as caught:
                await stranger.faults()
            seen.append((caught.value.status, caught.value.code, caught.value.message))
        async with ChaosClient(base_url, None) as anonymous:
            with pytest.raises(ChaosClientError) as caught:
                await anonymous.disarm_all()
            seen.append((caught.value.status, caught.value.code, caught.value.message))
        return seen

    seen = run(scenario())
    assert [(status, code) for status, code, _ in seen] == [
        (404, "chaos_fault_not_found"), (422, "chaos_invalid_fault"), (409, "chaos_unsupported"),
        (401, "unauthorized"), (401, "unauthorized")]
    assert "no such fault" in seen[0][2]  # the id travelled quoted and came back intact
    assert seen[1][2].startswith("ttl_s:")


def test_a_server_that_is_not_there_is_a_transport_error() -> None:
    with socket.socket() as sock:  # a port nobody listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

        async def scenario() -> ChaosClientError:
            async with ChaosClient(f"http://127.0.0.1:{port}", TOKEN, timeout_s=5) as chaos:
                with pytest.raises(ChaosClientError) as caught:
                    await chaos.faults()
                return caught.value

        error = run(scenario())
    assert (error.status, error.code) == (0, "transport")


def test_a_non_glassbox_error_body_still_says_what_came_back() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["Authorization"] == f"Bearer {TOKEN}"
        return httpx.Response(502, text="<html><body>Bad Gateway</body></html>")

    async def scenario() -> ChaosClientError:
        async with ChaosClient("http://staging", TOKEN, transport=httpx.MockTransport(handler)) as chaos:
            with pytest.raises(ChaosClientError) as caught:
                await chaos.arm({"fault": "oom", "ttl_s": 5})
            return caught.value

    error = run(scenario())
    assert (error.status, error.code) == (502, "http_502")
    assert "Bad Gateway" in error.message and "POST /chaos/faults" in error.message
