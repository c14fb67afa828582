"""The NVML device behind a CUDA device, found by UUID: whole GPUs, MIG instances (with and without a driver that
looks MIG UUIDs up itself), and no guess on a miss."""

from __future__ import annotations

import pytest

from glassbox.service.devices import bare_uuid, find_nvml_device
from tests.service.nvml_fake import MigNvml

A = "4f1c2b3a-0000-1111-2222-333344445555"
B = "9e8d7c6b-aaaa-bbbb-cccc-ddddeeeeffff"
MIG_1 = "7a6b5c4d-1234-5678-9abc-def012345678"
MIG_2 = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"

BOARDS: dict[str, dict[int, str] | None] = {f"GPU-{A}": None, f"GPU-{B}": {1: f"MIG-{MIG_1}", 4: f"MIG-{MIG_2}"}}


@pytest.mark.parametrize("written", [A, f"GPU-{A}", A.upper(), f"gpu-{A}"])
def test_a_whole_gpu_is_found_however_torch_writes_its_uuid(written: str) -> None:
    found = find_nvml_device(MigNvml(BOARDS), written, index=1)
    assert found is not None and (found.handle, found.uuid, found.how) == ("gpu0", f"GPU-{A}", "uuid")


@pytest.mark.parametrize("mig_by_uuid", [True, False], ids=["driver-looks-up-mig", "walks-the-mig-slots"])
def test_a_mig_instance_is_found_by_its_own_uuid_not_its_boards(mig_by_uuid: bool) -> None:
    nvml = MigNvml(BOARDS, mig_by_uuid=mig_by_uuid)
    found = find_nvml_device(nvml, MIG_2, index=0)  # torch numbers the instance 0: the index would pick gpu0
    assert found is not None
    assert (found.handle, found.uuid, found.how) == ("gpu1/mig4", f"MIG-{MIG_2}", "mig")
    assert nvml.calls[:2] == [f"GPU-{MIG_2}", f"MIG-{MIG_2}"]  # NVML's own lookup is tried first, both prefixes


def test_a_uuid_nvml_does_not_know_finds_nothing_rather_than_index_0() -> None:
    assert find_nvml_device(MigNvml(BOARDS), "00000000-dead-beef-0000-000000000000", index=0) is None


def test_without_a_uuid_the_index_is_used() -> None:
    found = find_nvml_device(MigNvml(BOARDS), "", index=1)
    assert found is not None and (found.handle, found.how) == ("gpu1", "index")


def test_bare_uuid() -> None:
    assert bare_uuid(f" MIG-{MIG_1.upper()} ") == bare_uuid(f"GPU-{MIG_1}") == bare_uuid(MIG_1) == MIG_1
