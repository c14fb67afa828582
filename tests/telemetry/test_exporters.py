"""telemetry/exporters.py: what the OTLP exporters do beyond encoding, against the receiver from
tests/telemetry/otlp_receiver.py: the OTEL_EXPORTER_OTLP_* settings, retries of what the specification calls
retryable, no retry of the rest, the failure hook, and shutdown cutting retries short."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import glassbox.telemetry.exporters
from glassbox.telemetry.exporters import ExportConfig, ItemExporter, retry_after
from glassbox.telemetry.otlp import span_exporter
from tests.telemetry.otlp_receiver import Receiver, http_receiver
from tests.telemetry.test_otlpwire import RESOURCE, items
from tests.telemetry.tracetools import settings


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(glassbox.telemetry.exporters, "FIRST_BACKOFF_S", 0.05)


def retryable(protocol: str) -> Any:
    if protocol == "grpc":
        import grpc

        return grpc.StatusCode.UNAVAILABLE
    return 503


def permanent(protocol: str) -> Any:
    if protocol == "grpc":
        import grpc

        return grpc.StatusCode.INVALID_ARGUMENT
    return 400


def exporter_for(protocol: str, running: Receiver, failures: list[str], timeout_s: float = 10.0) -> ItemExporter:
    exporter = span_exporter(settings(otlp_endpoint=running.endpoint, otlp_protocol=protocol), resource=RESOURCE,
                             timeout_s=timeout_s, on_failure=failures.append)
    assert isinstance(exporter, ItemExporter)
    return exporter


def export_once(protocol: str, running: Receiver, failures: list[str], timeout_s: float = 10.0) -> str:
    """One export of the standard items through a fresh exporter, shut down after: the result's name."""
    exporter = exporter_for(protocol, running, failures, timeout_s)
    try:
        return exporter.export(items()).name
    finally:
        exporter.shutdown()


def test_retryable_refusals_are_retried_until_the_collector_takes_the_batch(receiver: tuple[str, Receiver]) -> None:
    protocol, running = receiver
    running.store.refuse = [retryable(protocol), retryable(protocol)]
    failures: list[str] = []
    assert export_once(protocol, running, failures) == "SUCCESS"
    assert len(running.store.attempts) == 3 and running.store.requests == 1
    assert len(running.spans()) == 31 and failures == []


def test_a_permanent_refusal_is_not_retried_and_is_reported(receiver: tuple[str, Receiver]) -> None:
    protocol, running = receiver
    running.store.refuse = [permanent(protocol)]
    failures: list[str] = []
    assert export_once(protocol, running, failures) == "FAILURE"
    assert len(running.store.attempts) == 1 and running.spans() == []
    assert len(failures) == 1 and ("400" in failures[0] or "INVALID_ARGUMENT" in failures[0])


def test_retries_stop_at_the_timeout(receiver: tuple[str, Receiver]) -> None:
    protocol, running = receiver
    running.store.refuse = [retryable(protocol)] * 1000
    failures: list[str] = []
    started = time.monotonic()
    assert export_once(protocol, running, failures, timeout_s=0.5) == "FAILURE"
    assert time.monotonic() - started < 5  # bounded by the timeout, not by the refusals
    assert 1 <= len(running.store.attempts) < 1000 and len(failures) == 1


def test_shutdown_cuts_a_retry_wait_short(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(glassbox.telemetry.exporters, "FIRST_BACKOFF_S", 30.0)
    with http_receiver() as running:
        running.store.refuse = [503] * 10
        failures: list[str] = []
        exporter = exporter_for("http/protobuf", running, failures, timeout_s=120.0)
        results: list[str] = []
        worker = threading.Thread(target=lambda: results.append(exporter.export(items()).name))
        worker.start()
        deadline = time.monotonic() + 10
        while not running.store.attempts and time.monotonic() < deadline:
            time.sleep(0.01)
        exporter.shutdown()
        worker.join(10)
    assert results == ["FAILURE"] and len(running.store.attempts) == 1
    assert "shutting down" in failures[0]
    assert exporter.export(items()).name == "FAILURE"  # after shutdown nothing is sent


def test_the_standard_variables_set_headers_and_compression(receiver: tuple[str, Receiver],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    protocol, running = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-general=1,x-tenant=general")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "X-Tenant=team%20a")  # the signal's own wins
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
    assert export_once(protocol, running, []) == "SUCCESS"
    [attempt] = running.store.attempts
    assert attempt["x-tenant"] == "team a" and "x-general" not in attempt
    if protocol == "http/protobuf":  # grpcio keeps its transport headers from the servicer
        assert attempt["content-encoding"] == "gzip"
    assert len(running.spans()) == 31  # the receiver decompressed and decoded all of it


def test_the_general_variables_apply_when_the_signal_has_none() -> None:
    config = ExportConfig.from_environ({"OTEL_EXPORTER_OTLP_HEADERS": "a=1", "OTEL_EXPORTER_OTLP_COMPRESSION": "GZIP",
                                        "OTEL_EXPORTER_OTLP_CERTIFICATE": "/ca.pem"})
    assert (config.headers, config.compression, config.certificate) == ({"a": "1"}, "gzip", "/ca.pem")
    assert ExportConfig.from_environ({"OTEL_EXPORTER_OTLP_COMPRESSION": "brotli"}).compression == "none"


@pytest.mark.parametrize(("value", "seconds"), [("3", 3.0), ("0.5", 0.5), (None, None), ("soon", None),
                                                ("-1", None)])
def test_retry_after_seconds(value: str | None, seconds: float | None) -> None:
    assert retry_after(value) == seconds
