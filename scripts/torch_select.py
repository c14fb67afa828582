"""Which torch build this host can run, and whether the installed one really sees the GPU.

    python3 scripts/torch_select.py choose [--variants cu126,cu128,cu130]   # prints cpu or cuXYZ
    python scripts/torch_select.py verify --variant cu128 --version 2.13.0    # with the venv's python

`choose` reads the driver's CUDA version from `nvidia-smi` (the "CUDA Version: X.Y" in its header: the newest CUDA
the installed driver supports) and picks the newest CUDA build of torch that is not newer than it. A 12.x driver
older than every 12.x build still gets the oldest 12.x build: CUDA's minor-version compatibility runs any 12.x
build on any 12.x driver (driver 525 or newer). A driver older than CUDA 12 gets an error, not a silent CPU build.
No `nvidia-smi`, or one that lists no GPU, means `cpu`. `TORCH_VARIANT` (cpu or cuXYZ) overrides the choice.

`verify` fails loudly unless torch has the expected version and CUDA build and `torch.cuda.is_available()` is
True, so that `make` never leaves a GPU host with a torch that quietly runs on the CPU.

Standard library only: `make` runs `choose` with the system python3, before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass

# The CUDA builds PyTorch publishes for the pinned torch version, each under download.pytorch.org/whl/<variant>.
DEFAULT_VARIANTS = ("cu126", "cu128", "cu130")
_CUDA_VERSION = re.compile(r"CUDA Version:\s*(\d+)\.(\d+)")
_DRIVER_VERSION = re.compile(r"Driver Version:\s*([\d.]+)")
_VARIANT = re.compile(r"cu(\d+)(\d)")


class SelectionError(Exception):
    """The host has a GPU, but no torch build in the list can run on its driver (or the driver cannot be read)."""


@dataclass(frozen=True, slots=True)
class Choice:
    variant: str  # "cpu" or "cuXYZ"
    reason: str  # one sentence, printed by make


def variant_version(variant: str) -> tuple[int, int]:
    """"cu128" -> (12, 8), "cu130" -> (13, 0)."""
    match = _VARIANT.fullmatch(variant)
    if match is None:
        raise SelectionError(f"not a CUDA variant of torch: {variant!r} (expected cuXYZ, e.g. cu128)")
    return int(match.group(1)), int(match.group(2))


def read_nvidia_smi() -> str | None:
    """The output of `nvidia-smi` when it runs and lists at least one GPU; None otherwise."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
        if listed.returncode != 0 or "GPU" not in listed.stdout:
            return None
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return header.stdout if header.returncode == 0 else None


def choose(smi_output: str | None, variants: tuple[str, ...] = DEFAULT_VARIANTS) -> Choice:
    if smi_output is None:
        return Choice("cpu", "no NVIDIA GPU found (nvidia-smi is missing or lists none): torch's CPU build")
    found = _CUDA_VERSION.search(smi_output)
    driver = _DRIVER_VERSION.search(smi_output)
    driver_text = f"driver {driver.group(1)}" if driver else "the driver"
    if found is None:
        raise SelectionError("nvidia-smi lists a GPU but no 'CUDA Version: X.Y'; set TORCH_VARIANT=cuXYZ by hand")
    supported = (int(found.group(1)), int(found.group(2)))
    by_version = sorted((variant_version(v), v) for v in variants)
    fitting = [v for version, v in by_version if version <= supported]
    if fitting:
        return Choice(fitting[-1], f"{driver_text} supports CUDA {supported[0]}.{supported[1]}: the newest torch "
                                   f"build not newer than that is {fitting[-1]}")
    same_major = [v for version, v in by_version if version[0] == supported[0] and version[0] >= 12]
    if same_major:
        return Choice(same_major[0], f"{driver_text} supports CUDA {supported[0]}.{supported[1]}, older than every "
                                     f"build; {same_major[0]} runs on it through CUDA minor-version compatibility")
    raise SelectionError(
        f"{driver_text} supports only CUDA {supported[0]}.{supported[1]}; the torch builds available "
        f"({', '.join(variants)}) need a newer driver (CUDA 12 builds: 525 or newer, CUDA 13: 580 or newer). "
        "Upgrade the driver, or set TORCH_VARIANT=cpu to run on the CPU on purpose")


def verify(variant: str, version: str) -> str:
    """A line saying what torch sees; raises SelectionError when it is not what `variant` promised."""
    import torch

    installed = torch.__version__.split("+")[0]
    if installed != version:
        raise SelectionError(f"torch {torch.__version__} is installed, {version} was asked for")
    if variant == "cpu":
        return f"torch {torch.__version__} (CPU build)"
    major, minor = variant_version(variant)
    built = torch.version.cuda
    if built is None or tuple(int(p) for p in built.split(".")[:2]) != (major, minor):
        raise SelectionError(f"torch {torch.__version__} was built for CUDA {built}, not {major}.{minor} ({variant})")
    if not torch.cuda.is_available():
        raise SelectionError(
            f"torch {torch.__version__} (CUDA {built}) does not see a usable GPU: torch.cuda.is_available() is False. "
            "Check `nvidia-smi`, the driver's CUDA version, and CUDA_VISIBLE_DEVICES")
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return f"torch {torch.__version__} sees {torch.cuda.device_count()} CUDA device(s): {names}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torch_select", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    pick = sub.add_parser("choose", help="print the torch variant for this host (cpu or cuXYZ)")
    pick.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help="CUDA builds to choose from")
    check = sub.add_parser("verify", help="fail unless the installed torch is the variant asked for")
    check.add_argument("--variant", required=True)
    check.add_argument("--version", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "choose":
            forced = os.environ.get("TORCH_VARIANT", "").strip()
            if forced:
                if forced != "cpu":
                    variant_version(forced)
                choice = Choice(forced, "TORCH_VARIANT was set")
            else:
                variants = tuple(v for v in args.variants.replace(" ", "").split(",") if v)
                choice = choose(read_nvidia_smi(), variants)
            print(f"torch variant: {choice.variant} ({choice.reason})", file=sys.stderr)
            print(choice.variant)
            return 0
        print(verify(args.variant, args.version), file=sys.stderr)
        return 0
    except SelectionError as exc:
        print(f"torch_select: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
