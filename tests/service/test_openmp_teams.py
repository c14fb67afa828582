"""OpenMP teams: the engine process keeps its main thread serial, and engine threads size their own teams so that
libgomp's managed threads never outnumber the CPUs (service/cores.py, service/runtime.py IntraOpTeams)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from glassbox.service.cores import USER_OMP_THREADS_ENV, available_cores
from glassbox.service.runtime import IntraOpTeams
from glassbox.service.serving.local import in_own_thread

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("threads", "runners", "cores", "limits"), [
    (2, 2, 2, (2, 1)),  # the 2-core host: one team of two, the second engine thread on one
    (16, 2, 16, (16, 1)),
    (8, 2, 16, (8, 8)),
    (4, 3, 8, (4, 3, 3)),
    (2, 1, 2, (2,)),
])
def test_the_teams_fit_the_cpus(threads: int, runners: int, cores: int, limits: tuple[int, ...]) -> None:
    teams = IntraOpTeams(threads, runners, cores)
    assert teams.limits == limits
    # what libgomp counts: the main thread (serial) plus every team's workers
    assert 1 + sum(limit - 1 for limit in teams.limits) <= cores


def on_thread(call: object) -> object:
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(call()))  # type: ignore[operator]
    thread.start()
    thread.join()
    return out[0]


def test_an_engine_thread_takes_its_share_within_its_limit() -> None:
    teams = IntraOpTeams(2, 2, 2)

    def first() -> list[int]:
        teams.started(0)
        seen = [torch.get_num_threads()]
        for running in (1, 2, 1):
            teams.share(running)
            seen.append(torch.get_num_threads())
        return seen

    def second() -> list[int]:
        teams.started(1)
        seen = [torch.get_num_threads()]
        teams.share(1)  # even alone it stays within its limit: a team of two here would slow thread 0's
        seen.append(torch.get_num_threads())
        return seen

    main_before = torch.get_num_threads()
    assert on_thread(first) == [2, 2, 1, 2]
    assert on_thread(second) == [1, 1]
    assert torch.get_num_threads() == main_before  # per thread: the caller's own count is untouched


CLEAN = ("OMP_NUM_THREADS", USER_OMP_THREADS_ENV, "GOMP_SPINCOUNT")


def probe(env: dict[str, str], code: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120, check=True)
    return result.stdout.split()


SERIAL = ("import os; from glassbox.service.cores import serial_main_thread, intra_op_threads; "
          "kept = serial_main_thread(); import torch; "
          "print(kept, torch.get_num_threads(), intra_op_threads(0, torch.get_num_threads), "
          "os.environ['OMP_NUM_THREADS'], repr(os.environ['GLASSBOX_USER_OMP_NUM_THREADS']), "
          "os.environ['GOMP_SPINCOUNT'])")


def test_the_main_thread_is_serial_and_the_engine_threads_get_the_cores() -> None:
    base = {k: v for k, v in os.environ.items() if k not in CLEAN}
    kept, main_threads, engine_threads, omp, user, spin = probe(base, SERIAL)
    assert (kept, main_threads, omp, user, spin) == ("True", "1", "1", "''", "4000")
    import psutil

    assert int(engine_threads) == max(1, min(psutil.cpu_count(logical=False) or available_cores(), available_cores()))


def test_a_users_settings_are_kept() -> None:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN} | {"OMP_NUM_THREADS": "3", "GOMP_SPINCOUNT": "5"}
    kept, main_threads, engine_threads, omp, user, spin = probe(env, SERIAL)
    # their thread count becomes the engine threads' (the main thread stays serial), their spin count stays
    assert (kept, main_threads, engine_threads, omp, user, spin) == ("True", "1", "3", "1", "'3'", "5")


def test_too_late_once_torch_is_loaded() -> None:
    code = ("import os, torch; from glassbox.service.cores import serial_main_thread; "
            "print(serial_main_thread(), os.environ.get('OMP_NUM_THREADS', '-'))")
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    assert probe(env, code) == ["False", "-"]  # libgomp read its environment already: nothing is changed


def test_warm_up_runs_on_a_thread_that_ends_with_it() -> None:
    names: list[str] = []

    def work() -> int:
        names.append(threading.current_thread().name)
        return 7

    def fail() -> int:
        raise ValueError("no model")

    async def scenario() -> None:
        assert await in_own_thread(work, "glassbox-warmup") == 7
        with pytest.raises(ValueError, match="no model"):
            await in_own_thread(fail, "glassbox-warmup")

    asyncio.run(scenario())
    assert names == ["glassbox-warmup"]
    for thread in threading.enumerate():
        if thread.name == "glassbox-warmup":
            thread.join(5)
    assert "glassbox-warmup" not in {t.name for t in threading.enumerate()}
