"""tests/gpu_gate.py in a child pytest: on a GPU host a skipped gpu test, or a CPU-chosen device, fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu_gate import device_problem

ROOT = Path(__file__).resolve().parents[1]

SKIPPING_GPU_TEST = '''
import pytest

@pytest.mark.gpu
def test_needs_a_device():
    pytest.skip("needs a CUDA device")

def test_plain():
    assert True
'''
# A conftest that makes torch claim a GPU, so the session check passes and the skip hook is what is tested.
PRETEND_GPU = '''
import torch

def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device")

torch.cuda.is_available = lambda: True
torch.cuda.get_device_name = lambda index=0: "Pretend GPU"
'''


def child_pytest(directory: Path, require: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GLASSBOX_REQUIRE_GPU": require, "PYTHONPATH": str(ROOT),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "tests.gpu_gate", "-p", "no:cacheprovider",
               "--rootdir", str(directory), str(directory)]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=directory, timeout=120, check=False)


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    (tmp_path / "test_sample.py").write_text(SKIPPING_GPU_TEST)
    return tmp_path


def test_a_skipped_gpu_test_fails_when_a_gpu_is_required(suite: Path) -> None:
    (suite / "conftest.py").write_text(PRETEND_GPU)
    done = child_pytest(suite, "1")
    assert done.returncode == 1, done.stdout
    assert "1 failed, 1 passed" in done.stdout
    assert "gpu test skipped on a GPU host" in done.stdout and "needs a CUDA device" in done.stdout


def test_without_the_requirement_the_skip_stays_a_skip(suite: Path) -> None:
    (suite / "conftest.py").write_text(PRETEND_GPU)
    done = child_pytest(suite, "0")
    assert done.returncode == 0, done.stdout
    assert "1 passed, 1 skipped" in done.stdout


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a CUDA device")
def test_requiring_a_gpu_where_torch_sees_none_stops_the_session(suite: Path) -> None:
    (suite / "conftest.py").write_text('def pytest_configure(config):\n'
                                       '    config.addinivalue_line("markers", "gpu: needs a CUDA device")\n')
    done = child_pytest(suite, "1")
    assert done.returncode == 1
    assert "torch.cuda.is_available() is False" in done.stdout + done.stderr
    assert "passed" not in done.stdout  # stopped before any test ran


def test_device_problem_names_each_failure() -> None:
    assert device_problem(True, "cuda:0") is None
    assert "is_available() is False" in (device_problem(False, "cpu") or "")
    assert "chooses cpu" in (device_problem(True, "cpu") or "")
