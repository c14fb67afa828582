"""`glassbox classify --metrics-port`: the server's stage and batch metrics, scraped while a run goes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_served_while_the_run_goes(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Feed one window of 20 texts and a bad line through stdin, scrape, then end the input."""
    port = free_port()
    out = tmp_path / "out.jsonl"
    args = [sys.executable, "-m", "glassbox.service.cli", "classify", "-", "--format", "jsonl", "--model",
            str(tiny_model_dir), "--device", "cpu", "--window", "21", "--on-error", "skip", "--metrics-port", str(port),
            "--no-progress", "--out", str(out)]
    run = subprocess.Popen(args, stdin=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.stdin is not None and run.stderr is not None
    try:
        lines = [b'{"text": "good movie number %d"}' % i for i in range(20)] + [b"{broken"]
        run.stdin.write(b"\n".join(lines) + b"\n")
        run.stdin.flush()
        progress = tmp_path / "out.jsonl.progress"
        deadline = time.monotonic() + 120
        while not (progress.exists() and '"done": 21' in progress.read_text()):
            assert run.poll() is None, run.stderr.read().decode()
            assert time.monotonic() < deadline, "the first window never finished"
            time.sleep(0.02)
        found = samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
    finally:
        run.stdin.close()
        code = run.wait(timeout=120)
    assert code == 0, run.stderr.read().decode()
    assert found[("glassbox_texts_total", (("route", "bulk"),))] == 20
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    tokens = sum(len(tokenizer.encode(f"good movie number {i}").ids) for i in range(20))
    assert found[("glassbox_tokens_total", (("route", "bulk"),))] == tokens
    assert found[("glassbox_requests_total", (("code", "invalid_json"), ("route", "bulk"), ("status", "400")))] == 1
    for stage in ("tokenize", "infer", "postprocess"):  # other labels (a device on infer) may come with the stage
        counts = [value for (name, labels), value in found.items()
                  if name == "glassbox_stage_duration_seconds_count" and ("stage", stage) in labels]
        assert sum(counts) == 1, stage
    assert found[("glassbox_batch_size_count", ())] >= 1
    assert found[("glassbox_batch_size_sum", ())] == 20
