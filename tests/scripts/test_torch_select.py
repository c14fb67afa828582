"""scripts/torch_select.py against a fake `nvidia-smi` on PATH: the torch build a host gets from its driver."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "torch_select.py"
sys.path.insert(0, str(SCRIPT.parent))
import torch_select  # noqa: E402  (a script, not a package)

HEADER = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {driver}              Driver Version: {driver}      CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
|   0  NVIDIA H200                    On  |   00000000:19:00.0 Off |                    0 |
+-----------------------------------------+------------------------+----------------------+
"""


def fake_smi(directory: Path, *, driver: str = "", cuda: str = "", broken: bool = False) -> Path:
    """An executable `nvidia-smi` that answers `-L` and prints a header with the given versions (shell builtins
    only: the PATH it runs under holds nothing else). `broken`: what a host with an unloaded driver prints."""
    directory.mkdir(parents=True, exist_ok=True)
    if broken:
        body = 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."; exit 9\n'
    else:
        header = HEADER.format(driver=driver, cuda=cuda).replace("'", "")
        body = ('if [ "$1" = "-L" ]; then echo "GPU 0: NVIDIA H200 (UUID: GPU-0f1e2d3c)"; exit 0; fi\n'
                f"printf '%s\\n' '{header}'\n")
    path = directory / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return directory


def choose_with(path_dir: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # PATH holds only the fake: a real nvidia-smi on this machine must not decide the answer.
    environ = {"PATH": str(path_dir), **(env or {})}
    return subprocess.run([sys.executable, str(SCRIPT), "choose", *extra], capture_output=True, text=True,
                          env=environ, check=False, timeout=60)


@pytest.mark.parametrize(("driver", "cuda", "variant"), [
    ("580.65.06", "13.0", "cu130"),
    ("590.10", "13.1", "cu130"),
    ("575.51.03", "12.9", "cu128"),
    ("570.86.15", "12.8", "cu128"),
    ("560.35.03", "12.6", "cu126"),
    ("550.54.15", "12.4", "cu126"),  # older than every 12.x build: minor-version compatibility
    ("535.183.01", "12.2", "cu126"),
])
def test_the_driver_cuda_version_picks_the_build(tmp_path: Path, driver: str, cuda: str, variant: str) -> None:
    done = choose_with(fake_smi(tmp_path / "bin", driver=driver, cuda=cuda))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == variant
    assert f"driver {driver}" in done.stderr


def test_a_driver_older_than_cuda_12_is_an_error_not_a_cpu_build(tmp_path: Path) -> None:
    done = choose_with(fake_smi(tmp_path / "bin", driver="470.256.02", cuda="11.4"))
    assert done.returncode == 1 and done.stdout == ""
    assert "supports only CUDA 11.4" in done.stderr and "TORCH_VARIANT=cpu" in done.stderr


def test_a_shorter_variant_list_is_honoured(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path / "bin", driver="580.65.06", cuda="13.0")
    assert choose_with(smi, "--variants", "cu126,cu128").stdout.strip() == "cu128"


def test_without_nvidia_smi_the_cpu_build(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = choose_with(tmp_path / "empty")
    assert done.returncode == 0 and done.stdout.strip() == "cpu"


def test_an_nvidia_smi_that_cannot_reach_the_driver_means_cpu(tmp_path: Path) -> None:
    done = choose_with(fake_smi(tmp_path / "bin", broken=True))
    assert done.returncode == 0 and done.stdout.strip() == "cpu"


def test_torch_variant_overrides_and_is_checked(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path / "bin", driver="580.65.06", cuda="13.0")
    assert choose_with(smi, env={"TORCH_VARIANT": "cpu"}).stdout.strip() == "cpu"
    assert choose_with(smi, env={"TORCH_VARIANT": "cu126"}).stdout.strip() == "cu126"
    wrong = choose_with(smi, env={"TORCH_VARIANT": "cuda12"})
    assert wrong.returncode == 1 and "not a CUDA variant" in wrong.stderr


def test_a_header_without_a_cuda_version_is_an_error() -> None:
    with pytest.raises(torch_select.SelectionError, match="no 'CUDA Version"):
        torch_select.choose("| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15 |")


def test_verify_accepts_the_installed_torch_and_refuses_a_wrong_promise() -> None:
    version = torch.__version__.split("+")[0]
    if torch.version.cuda is None:
        assert "CPU build" in torch_select.verify("cpu", version)
        with pytest.raises(torch_select.SelectionError, match="built for CUDA None"):
            torch_select.verify("cu128", version)
    with pytest.raises(torch_select.SelectionError, match="was asked for"):
        torch_select.verify("cpu", "1.0.0")


def test_make_passes_the_pinned_version_to_both_builds() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "TORCH_VERSION       ?= 2.13.0" in makefile
    assert makefile.count('"torch==$(TORCH_VERSION)"') == 2  # the CPU wheel and the CUDA build: one version
    assert 'scripts/torch_select.py verify --variant "$$variant"' in makefile
