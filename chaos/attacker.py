"""Slow-client attackers in a process of their own, so the experiment's measuring load generator never shares an
event loop with them: a stalled attacker coroutine must not show up as latency of the well-behaved traffic.

    python -m glassbox.chaos.attacker '{"target": ..., "connections": ..., ...}'   (a SlowClientConfig as JSON)

SIGTERM or SIGINT stops the attack early; either way the report is printed as one JSON line on stdout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from glassbox.chaos.loadgen.slice import DEFAULT_SLICE, set_thread_slice
from glassbox.chaos.slowclients import SlowClientConfig, run_slow_clients


class Attacker:
    """The parent's handle on one attacker process.

    Started with subprocess.Popen, not the event loop's subprocess support: uvloop forks, and a fork copies the page
    tables of the whole parent while its event loop waits. In a parent holding a large heap (a test process that has
    run torch: ~1.8 GB) that took 70-100 ms a process, charged as latency to every request the load generator meant
    to send meanwhile, at the very start of the fault phase. Popen uses vfork: under a millisecond either way."""

    def __init__(self, config: SlowClientConfig) -> None:
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        spec = json.dumps(dataclasses.asdict(self.config))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "glassbox.chaos.attacker", spec], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)  # stopped by the runner's rollback, not by the terminal's Ctrl-C

    async def stop(self, timeout_s: float) -> dict[str, Any]:
        """Stop it (SIGTERM) and return its report; RuntimeError when it died without one or did not stop."""
        process = self.process
        if process is None:
            raise RuntimeError("the attacker never started")
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:  # in a thread: the loop goes on while the attacker writes its report
            out, err = await asyncio.to_thread(process.communicate, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)
            raise RuntimeError(f"the attacker did not stop within {timeout_s:g} s") from None
        lines = out.decode(errors="replace").strip().splitlines()
        if process.returncode != 0 or not lines:
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"the attacker exited with {process.returncode} without a report: {' | '.join(tail)}")
        report: dict[str, Any] = json.loads(lines[-1])
        return report


async def _attack(config: SlowClientConfig) -> dict[str, Any]:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    report = await run_slow_clients(config, stop)
    return report.to_json()


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m glassbox.chaos.attacker CONFIG_JSON", file=sys.stderr)
        return 2
    config = SlowClientConfig(**json.loads(argv[0]))
    # Started from the runner's thread mid-run, it inherits the load generator's short scheduler slice: slow clients
    # have no latency to protect, so they take the kernel's own back.
    set_thread_slice(DEFAULT_SLICE)
    print(json.dumps(asyncio.run(_attack(config))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
