"""The chaos control API over HTTP: 404 when chaos is off, 401 for any bad token before anything else is looked at
(compared with hmac.compare_digest), arm/list/disarm, 422 for bad specs, 409 for GPU faults on a CPU, GPU faults on a
modelled allocator, the expiry sweep with no traffic, and how the token is loaded."""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from glassbox.chaos.client import TOKEN_ENV
from glassbox.chaos.control import MAX_BODY_BYTES, ChaosControl, ChaosKit, load_token
from glassbox.chaos.faults import MAX_ARMED, FaultBoard, FaultChange
from glassbox.chaos.specs import parse_spec
from glassbox.service.app import create_app
from glassbox.service.errors import ConfigurationError, GlassboxError
from glassbox.service.http.errors import glassbox_exception
from glassbox.service.settings import Settings
from tests.chaos.fakes import FakeMemory
from tests.service.apptools import FakeEngine, app_settings, parse_server_timing, ready_client

TOKEN = "chaos-token-for-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROUTES = [("POST", "/chaos/faults"), ("GET", "/chaos/faults"), ("DELETE", "/chaos/faults"),
          ("DELETE", "/chaos/faults/0123456789ab")]


@pytest.fixture
def token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)


@pytest.fixture
def client(tiny_model_dir: Path, token_env: None) -> Iterator[TestClient]:
    app = create_app(app_settings(tiny_model_dir, chaos=True), engine=FakeEngine())
    with ready_client(app) as test_client:
        yield test_client


def arm(client: TestClient, **spec: Any) -> Any:
    return client.post("/chaos/faults", json={"ttl_s": 60, **spec}, headers=AUTH)


def error_of(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_a_401_names_its_scheme_with_cors_on_too(tiny_model_dir: Path, token_env: None) -> None:
    """The CORS wrapper answers a route's errors itself (so a browser's script sees them): its 401 still carries the
    WWW-Authenticate challenge, and every method the chaos path takes is named by a 405."""
    app = create_app(app_settings(tiny_model_dir, chaos=True, cors_allow_origin="https://app.example"),
                     engine=FakeEngine())
    with ready_client(app) as cors_client:
        refused = cors_client.get("/chaos/faults", headers={"Origin": "https://app.example"})
        assert error_of(refused) == (401, "unauthorized")
        assert refused.headers["WWW-Authenticate"] == "Bearer"
        assert refused.headers["Access-Control-Allow-Origin"] == "https://app.example"
        wrong_method = cors_client.put("/chaos/faults", headers=AUTH)
        assert error_of(wrong_method) == (405, "method_not_allowed")
        assert set(wrong_method.headers["Allow"].split(", ")) == {"DELETE", "GET", "HEAD", "OPTIONS", "POST"}


# --- off, and auth --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_without_chaos_the_routes_are_the_ordinary_404(tiny_model_dir: Path, token_env: None, method: str,
                                                       path: str) -> None:
    app = create_app(app_settings(tiny_model_dir), engine=FakeEngine())
    assert app.state.chaos is None
    with ready_client(app) as client:
        response = client.request(method, path, headers=AUTH, json={"fault": "oom", "ttl_s": 5})
    assert error_of(response) == (404, "not_found")


@pytest.mark.parametrize("authorization", [
    None, "", "Bearer", "Bearer ", "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}x",
    f"Token {TOKEN}", f"Bearer {TOKEN.upper()}",
])
@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_a_bad_or_missing_token_is_401_on_every_route(client: TestClient, method: str, path: str,
                                                      authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    response = client.request(method, path, headers=headers, json={"fault": "oom", "ttl_s": 5})
    # 401 even where the fault id does not exist and the body is fine: nothing is looked at before the token.
    assert error_of(response) == (401, "unauthorized")
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert response.headers["X-Request-Id"]
    assert client.get("/chaos/faults", headers=AUTH).json() == {"faults": []}  # nothing was armed


def test_the_scheme_is_case_insensitive(client: TestClient) -> None:
    assert client.get("/chaos/faults", headers={"Authorization": f"bearer {TOKEN}"}).status_code == 200


def test_tokens_are_compared_in_constant_time(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    assert client.get("/chaos/faults", headers=AUTH).status_code == 200
    assert client.get("/chaos/faults", headers={"Authorization": "Bearer x"}).status_code == 401
    assert len(calls) == 2
    # Digests of equal length whatever was sent, so not even the token's length shows in the timing.
    assert all(len(a) == len(b) == 32 for a, b in calls)


# --- arm, list, disarm ----------------------------------------------------------------------------------------------
def test_arm_list_and_disarm(client: TestClient) -> None:
    armed = arm(client, fault="latency", delay_ms=5)
    assert armed.status_code == 201
    fault = armed.json()
    assert armed.headers["Location"] == f"/chaos/faults/{fault['id']}"
    assert fault["fault"] == "latency" and fault["ttl_s"] == 60.0
    assert fault["params"] == {"distribution": "fixed", "delay_ms": 5.0}
    assert fault["expires_at"] == pytest.approx(fault["armed_at"] + 60.0)
    other = arm(client, fault="error", fraction=0.5).json()
    listed = client.get("/chaos/faults", headers=AUTH).json()["faults"]
    assert [f["id"] for f in listed] == [fault["id"], other["id"]]

    gone = client.delete(f"/chaos/faults/{fault['id']}", headers=AUTH)
    assert gone.status_code == 200 and [f["id"] for f in gone.json()["disarmed"]] == [fault["id"]]
    assert error_of(client.delete(f"/chaos/faults/{fault['id']}", headers=AUTH)) == (404, "chaos_fault_not_found")
    everything = client.delete("/chaos/faults", headers=AUTH)
    assert [f["id"] for f in everything.json()["disarmed"]] == [other["id"]]
    assert client.get("/chaos/faults", headers=AUTH).json() == {"faults": []}
    assert client.delete("/chaos/faults", headers=AUTH).json() == {"disarmed": []}


def test_an_empty_fault_id_disarms_nothing(client: TestClient) -> None:
    # `DELETE /chaos/faults/$ID` with an empty $ID once answered 307 to /chaos/faults, which a redirect-following
    # client (curl -L, requests) turned into "disarm every fault".
    fault = arm(client, fault="latency", delay_ms=5).json()
    assert client.delete("/chaos/faults/", headers=AUTH, follow_redirects=True).status_code == 404
    assert [f["id"] for f in client.get("/chaos/faults", headers=AUTH).json()["faults"]] == [fault["id"]]


def test_a_latency_fault_lands_in_the_infer_stage_and_an_error_fault_fails_requests(client: TestClient) -> None:
    fault_id = arm(client, fault="latency", delay_ms=30).json()["id"]
    slow = client.post("/v1/classify", json={"text": "a good movie"})
    assert slow.status_code == 200
    infer_ms = dict(parse_server_timing(slow.headers["Server-Timing"]))["infer"]
    assert infer_ms >= 30.0  # a lower bound: the engine thread slept at least that long inside the infer stage
    client.delete(f"/chaos/faults/{fault_id}", headers=AUTH)

    fault_id = arm(client, fault="error", fraction=1.0).json()["id"]
    failed = client.post("/v1/classify", json={"text": "a good movie"})
    assert error_of(failed) == (500, "engine_error")
    assert "(InjectedError)" in failed.json()["error"]["message"]  # its text, like any engine error's, is logged
    listed = client.get("/chaos/faults", headers=AUTH).json()["faults"]
    assert listed[0]["detail"] == {"batches_seen": 1, "batches_failed": 1}
    client.delete(f"/chaos/faults/{fault_id}", headers=AUTH)
    assert client.post("/v1/classify", json={"text": "a good movie"}).status_code == 200


@pytest.mark.parametrize(("body", "field"), [
    (b"{not json", "body"),
    (b"[1, 2]", "body"),
    (b'{"fault": "latency", "ttl_s": 5, "delay_ms": 5, "delay": 5}', "delay"),
    (b'{"fault": "oom", "ttl_s": 7200}', "ttl_s"),
    (b'{"fault": "fragmentation", "ttl_s": 5}', "inactive_mib"),  # invalid beats unsupported: 422 even on a CPU
    (b'{"fault": "oom", "ttl_s": 5, "pad": "' + b"x" * MAX_BODY_BYTES + b'"}', "body"),
    (b'{"fault": "\\ud800", "ttl_s": 1}', "body"),  # a lone surrogate is not Unicode text
    (b'{"fault": "oom", "ttl_s": 1, "mode": "\\udc00"}', "body"),
    (b'{"fault": "oom", "ttl_s": ' + b"9" * 5000 + b"}", "body"),  # past Python's int-from-text digit limit
    (b"[" * 20000, "body"),  # deeper than the parser recurses
])
def test_an_invalid_spec_is_422_naming_the_field(client: TestClient, body: bytes, field: str) -> None:
    response = client.post("/chaos/faults", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert error_of(response) == (422, "chaos_invalid_fault")
    assert response.json()["error"]["message"].startswith(f"{field}:")


def test_no_more_than_max_armed_faults(client: TestClient) -> None:
    for _ in range(MAX_ARMED):
        assert arm(client, fault="error", fraction=0.0).status_code == 201
    refused = arm(client, fault="error", fraction=0.0)
    assert error_of(refused) == (409, "chaos_too_many_faults")  # a valid fault: the server's state refuses it
    assert f"{MAX_ARMED} faults are armed" in refused.json()["error"]["message"]


@pytest.mark.parametrize("spec", [{"fault": "oom", "mode": "fill", "free_mib": 100},
                                  {"fault": "fragmentation", "inactive_mib": 64}])
def test_gpu_faults_on_a_cpu_are_409_and_say_why(client: TestClient, spec: dict[str, Any]) -> None:
    response = arm(client, **spec)
    assert error_of(response) == (409, "chaos_unsupported")
    assert "runs on cpu" in response.json()["error"]["message"]
    assert client.get("/chaos/faults", headers=AUTH).json() == {"faults": []}


# --- GPU faults, on the modelled allocator --------------------------------------------------------------------------
def gpu_control_app(memory: FakeMemory, board: FaultBoard) -> Starlette:
    """The control routes as the app mounts them, over a "cuda:0" primary whose allocator is `memory`."""
    control = ChaosControl(board, TOKEN, lambda: "cuda:0", lambda device: memory)
    return Starlette(routes=control.routes, exception_handlers={GlassboxError: glassbox_exception})


def test_fragmentation_reports_the_ratio_reached_and_disarm_frees_the_memory() -> None:
    memory = FakeMemory(4000)
    with TestClient(gpu_control_app(memory, FaultBoard())) as client:
        fault = arm(client, fault="fragmentation", inactive_mib=200).json()
        assert fault["detail"]["reached"] is True
        assert fault["detail"]["fragmentation_ratio"] == round(memory.stats().fragmentation_ratio, 4) > 0.4
        assert memory.stats().inactive_split_bytes >= 200 << 20
        assert client.delete(f"/chaos/faults/{fault['id']}", headers=AUTH).status_code == 200
    assert memory.stats().reserved_bytes == 0


def test_fill_holds_memory_until_it_expires() -> None:
    clock = [0.0]
    memory = FakeMemory(4000)
    board = FaultBoard(clock=lambda: clock[0])
    with TestClient(gpu_control_app(memory, board)) as client:
        fault = arm(client, fault="oom", mode="fill", free_mib=1000).json()
        assert fault["params"] == {"mode": "fill", "free_mib": 1000}
        assert fault["detail"]["reached"] is True and fault["detail"]["held_mib"] == pytest.approx(3000, abs=2)
        clock[0] = 60.0
        assert client.get("/chaos/faults", headers=AUTH).json() == {"faults": []}
    assert memory.stats().reserved_bytes == 0


def test_a_full_board_refuses_a_gpu_fault_before_allocating_anything() -> None:
    memory = FakeMemory(4000)
    board = FaultBoard()
    for _ in range(MAX_ARMED):
        board.arm(parse_spec({"fault": "error", "ttl_s": 60, "fraction": 0.0}))
    with TestClient(gpu_control_app(memory, board)) as client:
        assert error_of(arm(client, fault="fragmentation", inactive_mib=64)) == (409, "chaos_too_many_faults")
    assert memory.stats().reserved_bytes == 0


# --- expiry without traffic -----------------------------------------------------------------------------------------
def test_the_sweep_expires_faults_with_no_traffic_and_no_reads() -> None:
    clock = [0.0]
    kit = ChaosKit(TOKEN, board=FaultBoard(clock=lambda: clock[0]))
    gauge: dict[str, bool] = {}
    kit.export_to(gauge.__setitem__)
    assert gauge == {"oom": False, "latency": False, "error": False, "fragmentation": False}

    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        expired = asyncio.Event()
        events: list[str] = []

        def listener(change: FaultChange) -> None:
            events.append(change.event)
            if change.event == "expired":
                loop.call_soon_threadsafe(expired.set)  # the sweep expires from a worker thread

        kit.board.add_listener(listener)
        kit.board.arm(parse_spec({"fault": "latency", "ttl_s": 2, "delay_ms": 5}))
        assert gauge["latency"] is True
        sweep = asyncio.ensure_future(kit.sweep(interval_s=0.0))
        try:
            clock[0] = 2.0
            await asyncio.wait_for(expired.wait(), 30)
        finally:
            sweep.cancel()
        return events

    assert asyncio.run(scenario()) == ["armed", "expired"]
    assert gauge["latency"] is False


# --- the token ------------------------------------------------------------------------------------------------------
def test_the_token_comes_from_the_environment() -> None:
    assert load_token(Settings(chaos=True), {TOKEN_ENV: TOKEN}) == TOKEN


def test_a_token_file_loses_its_trailing_newline(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    assert load_token(Settings(chaos=True, chaos_token_file=str(path)), {}) == TOKEN


@pytest.mark.parametrize(("content", "environ", "message"), [
    (None, {}, "--chaos needs a bearer token"),
    ("", {}, "is empty"),
    ("\n", {}, "is empty"),
    ("missing", {}, "cannot read it"),
    (TOKEN, {TOKEN_ENV: TOKEN}, "given twice"),
    ("two words here-0123456789", {}, "printable ASCII without spaces"),
    ("tökén-0123456789abcdef", {}, "printable ASCII without spaces"),
])
def test_token_problems_are_configuration_errors(tmp_path: Path, content: str | None, environ: dict[str, str],
                                                 message: str) -> None:
    path = tmp_path / "token"
    if content not in (None, "missing"):
        path.write_text(content, encoding="utf-8")
    settings = Settings(chaos=True, chaos_token_file="" if content is None else str(path))
    with pytest.raises(ConfigurationError, match=message):
        load_token(settings, environ)


def test_a_short_token_is_taken_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="glassbox.chaos"):
        assert load_token(Settings(chaos=True), {TOKEN_ENV: "short"}) == "short"
    assert "shorter than 16" in caplog.text


def test_chaos_without_a_token_fails_before_the_model_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    settings = app_settings(tmp_path / "no-such-model", chaos=True)
    with pytest.raises(ConfigurationError, match="needs a bearer token"):
        create_app(settings)
