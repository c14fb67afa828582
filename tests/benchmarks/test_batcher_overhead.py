"""benchmarks.batcher_overhead runs a real Batcher end to end and reports what it measured."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks.batcher_overhead import main

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_a_short_run_answers_every_request_in_batches(tmp_path: Path) -> None:
    out = tmp_path / "batcher.json"
    assert main(["--clients", "8", "--requests", "400", "--rounds", "2", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert len(results["rounds"]) == 2
    for round_ in results["rounds"]:
        assert round_["requests_per_s"] > 0
        assert 1.0 <= round_["mean_batch"] <= 8.0  # eight clients: never more than eight rows in one batch
        assert round_["loop_us_per_request"] >= 0 and round_["engine_threads_us_per_request"] >= 0
