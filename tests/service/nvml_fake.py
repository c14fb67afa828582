"""A double of the pynvml calls glassbox.service.devices makes: GPUs, each with MIG instances in numbered slots.

`mig_by_uuid=False` plays a driver whose by-UUID lookup knows whole GPUs only, so the lookup must walk the MIG
instances itself. Handles are strings ("gpu0", "gpu1/mig2") so a test can read which device was found."""

from __future__ import annotations


class NotFound(Exception):
    pass


class NotSupported(Exception):
    pass


class MigNvml:
    def __init__(self, boards: dict[str, dict[int, str] | None], *, mig_by_uuid: bool = True) -> None:
        """`boards`: GPU uuid (with "GPU-") -> {slot: MIG uuid (with "MIG-")}, or None for a board without MIG."""
        self.boards = list(boards.items())
        self.mig_by_uuid = mig_by_uuid
        self.calls: list[str] = []

    def nvmlDeviceGetCount(self) -> int:
        return len(self.boards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        if index >= len(self.boards):
            raise NotFound(index)
        return f"gpu{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self.calls.append(uuid)
        for index, (board, migs) in enumerate(self.boards):
            if uuid == board:
                return f"gpu{index}"
            for slot, mig in (migs or {}).items():
                if uuid == mig and self.mig_by_uuid:
                    return f"gpu{index}/mig{slot}"
        raise NotFound(uuid)

    def nvmlDeviceGetUUID(self, handle: str) -> bytes:  # older pynvml returns bytes
        board, _, slot = handle.partition("/mig")
        uuid, migs = self.boards[int(board.removeprefix("gpu"))]
        return (migs or {})[int(slot)].encode() if slot else uuid.encode()

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: str) -> int:
        migs = self.boards[int(handle.removeprefix("gpu"))][1]
        if migs is None:
            raise NotSupported(handle)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: str, slot: int) -> str:
        migs = self.boards[int(handle.removeprefix("gpu"))][1] or {}
        if slot not in migs:
            raise NotFound(slot)
        return f"{handle}/mig{slot}"
