"""A local `glassbox serve --chaos` for an experiment run without --target: a free port on 127.0.0.1, a fresh
chaos token passed through the environment (never on the command line, where `ps` would show it), its log captured
to a file, readiness awaited, and SIGTERM (the graceful drain) at the end."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from glassbox.chaos.client import TOKEN_ENV
from glassbox.service.errors import GlassboxError

STOP_TIMEOUT_S = 30.0


class ServerStartError(GlassboxError):
    """The local server exited or did not become ready; the message ends with the tail of its log."""

    code = "chaos_server_start_failed"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def serve_argv(model: str | None, port: int, extra: tuple[str, ...]) -> list[str]:
    argv = [sys.executable, "-m", "glassbox.service", "serve", "--chaos", "--host", "127.0.0.1", "--port", str(port)]
    if model and model != "default":
        argv += ["--model", model]
    return argv + list(extra)  # last, so an experiment's flags win over ours where argparse lets the last one win


class LocalServer:
    """Async context manager: `async with LocalServer(...) as server: server.url, server.token`."""

    def __init__(self, model: str | None, serve_args: tuple[str, ...], log_path: Path,
                 startup_timeout_s: float = 180.0, *, port: int | None = None) -> None:
        self.model = model
        self.serve_args = serve_args
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.port = port or free_port()
        self.token = secrets.token_hex(32)  # hex: never starts with "-", which a command line would take for a flag
        self.process: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def argv(self) -> list[str]:
        return serve_argv(self.model, self.port, self.serve_args)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def start(self) -> None:
        env = dict(os.environ)
        env[TOKEN_ENV] = self.token
        with self.log_path.open("wb") as log:
            # A session of its own: Ctrl-C in a terminal reaches the runner only, which rolls back first and
            # then stops the server, rather than the server draining away under the rollback.
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                code = self.process.poll()
                if code is not None:
                    raise ServerStartError(f"glassbox serve exited with {code} before it was ready:\n"
                                           f"{self._log_tail()}")
                try:
                    if (await client.get(f"{self.url}/readyz")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    await self.stop()
                    raise ServerStartError(f"glassbox serve not ready after {self.startup_timeout_s:g} s:\n"
                                           f"{self._log_tail()}")
                await asyncio.sleep(0.1)  # polling a child process's readiness; bounded by the deadline

    async def stop(self) -> int | None:
        """SIGTERM and wait for the drain; SIGKILL if it outlives STOP_TIMEOUT_S. Returns the exit code."""
        process = self.process
        if process is None or self.exit_code is not None:
            return self.exit_code
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)
        self.exit_code = process.returncode
        return self.exit_code

    async def __aenter__(self) -> LocalServer:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
