"""Children of the supervisor do not outlive it: a supervisor killed with SIGKILL (or crashing) must not leave an
engine holding the device and workers holding the port.

On Linux the kernel does it: PR_SET_PDEATHSIG sends this process SIGTERM (its graceful drain) when its parent
exits. Elsewhere, or if prctl is unavailable, a daemon thread checks the parent once a second."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import threading
import time

PR_SET_PDEATHSIG = 1
POLL_S = 1.0


def exit_with_parent() -> None:
    parent = os.getppid()
    if not _ask_the_kernel():
        threading.Thread(target=_watch, args=(parent,), name="glassbox-parent-watch", daemon=True).start()
    if os.getppid() != parent:  # the parent died before we asked
        os.kill(os.getpid(), signal.SIGTERM)


def _ask_the_kernel() -> bool:
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        return bool(libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0)
    except (OSError, AttributeError):  # not Linux, or no prctl
        return False


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)  # polling the parent pid: the portable fallback
    os.kill(os.getpid(), signal.SIGTERM)
