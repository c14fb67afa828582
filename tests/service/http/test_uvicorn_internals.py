"""Every uvicorn internal glassbox relies on, named, so that an upgrade fails here instead of in production.

`service/http/guard.py` subclasses uvicorn's httptools protocol and reads its per-connection state;
`service/serving/http_server.py` subclasses `uvicorn.Server` for the drain. None of that is uvicorn's documented
interface, which is why `pyproject.toml` pins uvicorn to the minor range these tests pass on. When an upgrade breaks one
of these, read the new uvicorn source for the same idea before widening the pin; the guard's own tests then say whether
it still works.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from glassbox.service.http.guard import GuardedHttpToolsProtocol

# Methods of HttpToolsProtocol the guard overrides and calls through super(), and their parameters.
PROTOCOL_METHODS: dict[str, tuple[str, ...]] = {
    "__init__": ("self", "config", "server_state", "app_state", "_loop"),
    "connection_made": ("self", "transport"),
    "connection_lost": ("self", "exc"),
    "pause_writing": ("self",),
    "resume_writing": ("self",),
    "data_received": ("self", "data"),
    "send_400_response": ("self", "msg"),
    "on_message_begin": ("self",),
    "on_url": ("self", "url"),
    "on_header": ("self", "name", "value"),
    "on_headers_complete": ("self",),
    "on_body": ("self", "body"),
    "on_message_complete": ("self",),
    "on_response_complete": ("self",),
    "shutdown": ("self",),
}
# Per-connection state the guard reads or replaces.
PROTOCOL_ATTRIBUTES = ("loop", "transport", "flow", "pipeline", "cycle", "headers", "server_state")
CYCLE_ATTRIBUTES = ("response_started", "response_complete", "disconnected", "keep_alive", "message_event")
FLOW_MEMBERS = ("read_paused", "pause_reading", "resume_reading")
# What the drain in service/serving/http_server.py uses of uvicorn.Server.
SERVER_ATTRIBUTES = ("should_exit", "force_exit", "server_state", "config")
SERVER_METHODS: dict[str, tuple[str, ...]] = {"serve": ("self", "sockets"), "startup": ("self", "sockets"),
                                              "handle_exit": ("self", "sig", "frame"),
                                              "on_tick": ("self", "counter")}


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("name", "parameters"), PROTOCOL_METHODS.items())
def test_the_protocol_methods_the_guard_overrides_exist_with_their_parameters(name: str,
                                                                              parameters: tuple[str, ...]) -> None:
    method = getattr(HttpToolsProtocol, name, None)
    assert callable(method), f"uvicorn's HttpToolsProtocol has no {name}"
    assert tuple(inspect.signature(method).parameters) == parameters
    assert name in vars(GuardedHttpToolsProtocol), f"{name} is listed here but the guard no longer overrides it"


def test_status_lines_are_prebuilt_for_the_guard_replies() -> None:
    for status in (408, 413, 431):
        assert STATUS_LINE[status].startswith(b"HTTP/1.1 %d " % status)
        assert STATUS_LINE[status].endswith(b"\r\n")


def test_a_connection_carries_the_state_the_guard_reads() -> None:
    """A real protocol on a fake transport, one request in: its attributes, its cycle's and its flow control's."""
    started = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        started.set()
        await asyncio.Event().wait()  # keeps the cycle open while it is inspected

    async def scenario() -> None:
        config = Config(app=app, lifespan="off", log_config=None)
        config.load()
        state = ServerState()
        assert isinstance(state.default_headers, list)
        assert isinstance(state.connections, set)
        protocol = HttpToolsProtocol(config, state, {}, asyncio.get_running_loop())
        transport = FakeTransport()
        protocol.connection_made(transport)
        protocol.data_received(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n")
        await started.wait()
        for name in PROTOCOL_ATTRIBUTES:
            assert hasattr(protocol, name), f"HttpToolsProtocol no longer has .{name}"
        assert protocol.transport is transport
        assert isinstance(protocol.flow, FlowControl)
        assert (b"content-length", b"2") in protocol.headers
        assert len(protocol.pipeline) == 0  # the running request's cycle is not queued behind itself
        cycle = protocol.cycle
        assert isinstance(cycle, RequestResponseCycle)
        for name in CYCLE_ATTRIBUTES:
            assert hasattr(cycle, name), f"RequestResponseCycle no longer has .{name}"
        assert isinstance(cycle.message_event, asyncio.Event)
        assert cycle.response_started is False and cycle.disconnected is False
        flow = FlowControl(transport)
        for name in FLOW_MEMBERS:
            assert hasattr(flow, name), f"FlowControl no longer has .{name}"
        protocol.connection_lost(None)

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_the_server_has_what_the_drain_uses() -> None:
    server = uvicorn.Server(uvicorn.Config(app=lambda *_: None))
    for name in SERVER_ATTRIBUTES:
        assert hasattr(server, name), f"uvicorn.Server no longer has .{name}"
    for name, parameters in SERVER_METHODS.items():
        assert tuple(inspect.signature(getattr(uvicorn.Server, name)).parameters) == parameters
    # The listeners appear only once the server has started: the drain closes them.
    assert "self.servers" in inspect.getsource(uvicorn.Server.startup)
    assert isinstance(uvicorn.Config(app=lambda *_: None, timeout_graceful_shutdown=3).timeout_graceful_shutdown, int)
    # --exit-when-dead-s reads liveness in on_tick every 10th tick, taking a tick for 100 ms: the main loop must still
    # call on_tick with its counter, 0.1 s apart, and stop when it returns True.
    main_loop = inspect.getsource(uvicorn.Server.main_loop)
    assert "await self.on_tick(counter)" in main_loop and "asyncio.sleep(0.1)" in main_loop


def test_uvicorn_logs_bytes_its_parser_refuses_with_the_warning_the_guard_leaves_out() -> None:
    # service/http/guard.py drops exactly this warning (it answers, counts and logs the request itself), through the
    # protocol's own `logger` attribute, which uvicorn also hands each request cycle and reads `.level` of.
    from glassbox.service.http.guard import PARSER_REFUSED

    source = inspect.getsource(HttpToolsProtocol.data_received)
    assert f'msg = "{PARSER_REFUSED}"' in source and "self.logger.warning(msg)" in source
    assert 'self.logger = logging.getLogger("uvicorn.error")' in inspect.getsource(HttpToolsProtocol.__init__)
    assert "logger=self.logger" in inspect.getsource(HttpToolsProtocol.on_headers_complete)


def test_prometheus_client_internals_used_by_the_multiprocess_scrape() -> None:
    """telemetry/multiproc.py puts exemplars back onto the samples the multiprocess collector reads."""
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.samples import Exemplar, Sample
    from prometheus_client.utils import floatToGoString

    sample = Sample("x_bucket", {"le": "1"}, 1.0)
    assert sample._replace(exemplar=Exemplar({"trace_id": "t"}, 0.5)).exemplar is not None
    assert floatToGoString(float("inf")) == "+Inf"  # type: ignore[no-untyped-call]
    assert callable(MultiProcessCollector.collect)


def test_prometheus_client_internals_used_to_retire_a_dead_process(tmp_path: Path) -> None:
    """telemetry/multiproc.py's retire_process reads and writes the multiprocess value files with the library's own
    MmapedDict, and the collector reads any `<kind>_<name>.db` file as that kind."""
    from prometheus_client.mmap_dict import MmapedDict, mmap_key
    from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

    key = mmap_key("x", "x_total", [], [], "help")
    written = MmapedDict(str(tmp_path / "counter_retired.db"))  # type: ignore[no-untyped-call]
    written.write_value(key, 3.0, 0.0)  # type: ignore[no-untyped-call]
    written.close()  # type: ignore[no-untyped-call]
    read = list(MmapedDict.read_all_values_from_file(str(tmp_path / "counter_retired.db")))  # type: ignore[no-untyped-call]
    assert [(k, v) for k, v, _, _ in read] == [(key, 3.0)]
    [metric] = MultiProcessCollector(None, str(tmp_path)).collect()  # type: ignore[no-untyped-call]
    assert [(s.name, s.value) for s in metric.samples] == [("x_total", 3.0)]
    assert callable(mark_process_dead)
