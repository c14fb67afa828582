"""On a GPU host, the test suite must not pass by quietly testing the CPU.

`make test` sets GLASSBOX_REQUIRE_GPU=1 when it installed a CUDA build of torch. Then:
- the session stops at once, failed, unless torch sees a CUDA device and `glassbox serve --device auto` would
  choose it (a CPU-chosen device is the symptom of a torch build the driver cannot run);
- a gpu-marked test that skips is reported as failed: a skip there means the test did not see the device.

tests/conftest.py imports the two hooks; tests/test_gpu_gate.py runs them in a child pytest.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

REQUIRE_GPU = "GLASSBOX_REQUIRE_GPU"


def gpu_required() -> bool:
    return os.environ.get(REQUIRE_GPU) == "1"


def device_problem(cuda_available: bool, chosen_device: str) -> str | None:
    """Why this GPU host fails the suite before any test runs, or None."""
    if not cuda_available:
        return ("GLASSBOX_REQUIRE_GPU=1 but torch.cuda.is_available() is False: the installed torch cannot use "
                "this host's GPU (see scripts/torch_select.py)")
    if not chosen_device.startswith("cuda"):
        return f"GLASSBOX_REQUIRE_GPU=1 but --device auto chooses {chosen_device}, not the GPU"
    return None


def pytest_sessionstart(session: pytest.Session) -> None:
    if not gpu_required():
        return
    import torch

    from glassbox.service.engines.factory import choose_device

    available = torch.cuda.is_available()
    problem = device_problem(available, choose_device("auto").device if available else "cpu")
    if problem is not None:
        pytest.exit(problem, returncode=pytest.ExitCode.TESTS_FAILED)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and gpu_required() and item.get_closest_marker("gpu") is not None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"gpu test skipped on a GPU host (GLASSBOX_REQUIRE_GPU=1): {reason}"
