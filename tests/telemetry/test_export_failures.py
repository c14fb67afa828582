"""glassbox_span_export_failures_total: the OTLP exporter's failure hook (telemetry/exporters.py), wired by the
telemetry the app builds, against the receiver from tests/telemetry/otlp_receiver.py."""

from __future__ import annotations

import asyncio

from glassbox.telemetry import build_telemetry
from tests.telemetry.otlp_receiver import http_receiver
from tests.telemetry.tracetools import request_record, settings, traceparent

FAILURES = "glassbox_span_export_failures_total"


def test_exports_the_collector_refuses_are_counted_and_accepted_ones_are_not() -> None:
    with http_receiver() as running:
        telemetry = build_telemetry(settings(otlp_endpoint=running.endpoint))
        registry = telemetry.registry
        assert registry.get_sample_value(FAILURES) == 0  # there from the start, so the first failure shows in rate()
        running.store.refuse = [400]  # a permanent refusal: reported at once, never retried
        observer = telemetry.compose()
        observer.on_request(request_record("refused", traceparent=traceparent()))
        asyncio.run(telemetry.stop())  # flushes the queued spans through the exporter
        assert len(running.store.attempts) == 1 and running.spans() == []
        assert registry.get_sample_value(FAILURES) == 1


def test_no_failure_is_counted_while_the_collector_takes_every_batch() -> None:
    with http_receiver() as running:
        telemetry = build_telemetry(settings(otlp_endpoint=running.endpoint))
        telemetry.compose().on_request(request_record("taken", traceparent=traceparent()))
        asyncio.run(telemetry.stop())
        assert running.spans()
        assert telemetry.registry.get_sample_value(FAILURES) == 0
