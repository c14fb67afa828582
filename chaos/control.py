"""The chaos control API (`/chaos/faults`) and everything chaos adds to one app, built by the composition root
(service/app.py) only when the server runs with `--chaos`.

Auth is a bearer token read once at start-up, from GLASSBOX_CHAOS_TOKEN or `--chaos-token-file` (never a flag of
its own, where `ps` would show it). Requests compare SHA-256 digests of the given and the expected token with
hmac.compare_digest, so neither the content nor the length of the token leaks through timing. Every route checks
the token before it looks at anything else: a bad token gets 401 whether or not the fault id exists.

Errors are glassbox.service.errors types raised to the app's handler, so they share the server's error body
`{"error": {"code", "message"}}`. Board operations run in a worker thread: disarming a GPU fault frees device
memory and empties the allocator's cache, which must not stall the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from glassbox.chaos.engine import ChaosEngine
from glassbox.chaos.faults import Fault, FaultBoard, FaultChange
from glassbox.chaos.gpu import DeviceMemory, TorchCudaMemory, fill, fragment
from glassbox.chaos.specs import FAULT_KINDS, FaultSpec, FragmentationSpec, OomSpec, parse_spec
from glassbox.chaos.token import load_token
from glassbox.service.engines.base import Engine
from glassbox.service.errors import ChaosInvalidFaultError, ChaosUnsupportedError, UnauthorizedError
from glassbox.service.settings import Settings

log = logging.getLogger("glassbox.chaos")

MAX_BODY_BYTES = 64 * 1024
SWEEP_INTERVAL_S = 0.25


def log_change(change: FaultChange) -> None:
    """One log line per arm, disarm or expiry."""
    fault = change.fault
    log.warning("chaos fault %s: %s id=%s params=%s ttl_s=%g detail=%s", change.event, fault.kind, fault.id,
                json.dumps(fault.spec.params_json(), sort_keys=True), fault.spec.ttl_s,
                json.dumps(dict(fault.detail), sort_keys=True))


class ChaosControl:
    """The `/chaos/faults` routes over one board. `device` is the primary engine's ("" when none was wrapped);
    GPU-only faults are refused with 409 unless it is a CUDA device."""

    def __init__(self, board: FaultBoard, token: str, device: Callable[[], str],
                 memory: Callable[[str], DeviceMemory] = TorchCudaMemory) -> None:
        self._board = board
        self._digest = hashlib.sha256(token.encode("ascii")).digest()
        self._device = device
        self._memory = memory
        self._gpu_lock = asyncio.Lock()  # one GPU allocation routine at a time; created on the app's loop

    @property
    def routes(self) -> list[Route]:
        return [
            Route("/chaos/faults", self.arm, methods=["POST"]),
            Route("/chaos/faults", self.list_faults, methods=["GET"]),
            Route("/chaos/faults", self.disarm_all, methods=["DELETE"]),
            Route("/chaos/faults/{fault_id}", self.disarm, methods=["DELETE"]),
        ]

    def authorize(self, request: Request) -> None:
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        given = hashlib.sha256(credentials.strip().encode("latin-1")).digest()  # headers arrive as latin-1
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, self._digest):
            raise UnauthorizedError("the chaos control API needs a valid bearer token (Authorization: Bearer ...)")

    async def arm(self, request: Request) -> Response:
        self.authorize(request)
        spec = parse_spec(await _json_body(request))
        if spec.needs_gpu:
            fault = await self._arm_gpu(spec)
        else:
            fault = await asyncio.to_thread(self._board.arm, spec)
        return JSONResponse(fault.to_json(), 201, headers={"Location": f"/chaos/faults/{fault.id}"})

    async def list_faults(self, request: Request) -> Response:
        self.authorize(request)
        faults = await asyncio.to_thread(self._board.faults)
        return JSONResponse({"faults": [fault.to_json() for fault in faults]})

    async def disarm(self, request: Request) -> Response:
        self.authorize(request)
        fault = await asyncio.to_thread(self._board.disarm, request.path_params["fault_id"])
        return JSONResponse({"disarmed": [fault.to_json()]})

    async def disarm_all(self, request: Request) -> Response:
        self.authorize(request)
        faults = await asyncio.to_thread(self._board.disarm_all)
        return JSONResponse({"disarmed": [fault.to_json() for fault in faults]})

    async def _arm_gpu(self, spec: FaultSpec) -> Fault:
        device = self._device()
        if not device.startswith("cuda"):
            what = "oom with mode fill" if isinstance(spec.params, OomSpec) else spec.kind
            raise ChaosUnsupportedError(
                f"{what} holds real GPU memory, but this server's primary engine runs on {device or 'no device'}; "
                "on a CPU, simulate an OOM with mode raise")
        await asyncio.to_thread(self._board.check_room)
        async with self._gpu_lock:
            memory = self._memory(device)
            params = spec.params
            if isinstance(params, FragmentationSpec):
                hold, detail = await asyncio.to_thread(fragment, memory, params.inactive_mib)
            else:
                assert isinstance(params, OomSpec) and params.free_mib is not None
                hold, detail = await asyncio.to_thread(fill, memory, params.free_mib)
            return await asyncio.to_thread(self._board.arm, spec, hold=hold, detail=detail)


async def _json_body(request: Request) -> Any:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise ChaosInvalidFaultError(f"body: over {MAX_BODY_BYTES} bytes; a fault spec is a small JSON object")
    try:
        value = json.loads(body)
        # A "\\ud800" escape decodes to a lone surrogate, which is not Unicode text: refused here, not deep in parsing.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise ChaosInvalidFaultError("body: nested too deeply; a fault spec is a small JSON object") from None
    except ValueError as exc:  # malformed JSON, bad UTF-8, lone surrogates, integers of thousands of digits
        raise ChaosInvalidFaultError(f"body: not valid JSON ({exc})") from None
    return value


class ChaosKit:
    """What `--chaos` adds to one app: the board, the engine wrapper, the control routes, the expiry sweep."""

    def __init__(self, token: str, *, seed: int = 0, board: FaultBoard | None = None,
                 memory: Callable[[str], DeviceMemory] = TorchCudaMemory) -> None:
        self.board = board or FaultBoard()
        self.board.add_listener(log_change)
        self._seed = seed
        self._device = ""
        self.control = ChaosControl(self.board, token, lambda: self._device, memory)

    @classmethod
    def from_settings(cls, settings: Settings, environ: Mapping[str, str]) -> ChaosKit:
        return cls(load_token(settings, environ), seed=settings.seed)

    @property
    def primary_device(self) -> str:
        return self._device

    def wrap_primary(self, engine: Engine) -> Engine:
        """The runtime's hook: the primary engine inside a ChaosEngine, before any fallback wrapper."""
        self._device = engine.device
        return ChaosEngine(engine, self.board, seed=self._seed)

    def export_to(self, set_active: Callable[[str, bool], None]) -> None:
        """Report every fault kind (0 now, then on every change) to `set_active(kind, active)`: the app passes
        Telemetry.set_chaos_fault, so chaos never imports telemetry."""
        for kind in FAULT_KINDS:
            set_active(kind, False)
        self.board.add_listener(lambda change: set_active(change.fault.kind, change.kind_active))

    async def sweep(self, interval_s: float = SWEEP_INTERVAL_S) -> None:
        """Expire faults on time without traffic; runs for the app's lifetime (the lifespan cancels it)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                if self.board.due():
                    await asyncio.to_thread(self.board.expire)
            except Exception:  # the sweep must outlive any one failure, or faults would stop expiring
                log.exception("chaos fault sweep failed")

    def close(self) -> None:
        """On shutdown: disarm everything, so held GPU memory goes back and the gauges end at 0."""
        self.board.disarm_all()
