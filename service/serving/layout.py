"""How many HTTP worker processes `glassbox serve` runs when `--workers auto` (the default).

The rule, from what was measured on the 2-core development machine (docs/benchmarks/2026-12-01-serving-v2.md):

- on a CPU host with up to 4 cores: 0, one process. There the engine's forward pass needs every core, and a separate
  front end only moves the same HTTP work into another process that competes for them (plus ~15 us of IPC per
  request); batch formation, not the split, is what brings the server close to its engine;
- on a CPU host with more cores: one worker per 8 cores, at least 1: the engine keeps most cores for its threads;
- on a GPU host: enough workers to feed the device, one per 2 cores, at least 2 and at most 8, leaving cores for the
  engine process (its event loop and the copy-out of results). Measured on one 16-core H200 host
  (docs/benchmarks/2026-12-04-gpu-h200.md): 8 workers served the most (8854 req/s against 8350 with 4, 2326 with 1,
  1020 with one process).

An explicit `--workers N` always wins; `--workers 0` forces one process anywhere.
"""

from __future__ import annotations

from glassbox.service.cores import available_cores


def auto_workers(cores: int, on_gpu: bool) -> int:
    if on_gpu:
        return max(2, min(8, cores // 2))
    if cores <= 4:
        return 0
    return max(1, cores // 8)


def resolve_workers(setting: str, device: str) -> int:
    """The worker count for the `workers` setting ("auto" or an integer >= 0) and the device the engine will use."""
    if setting != "auto":
        return int(setting)
    return auto_workers(available_cores(), device.startswith("cuda"))
