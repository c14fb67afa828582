"""Telemetry: turns what happened into metrics, traces and logs. Nothing in service/ imports it, except the
composition roots (service/app.py, service/cli.py, service/serving/, service/bulk/command.py)."""

from glassbox.telemetry.fanout import CompositeObserver
from glassbox.telemetry.logs import configure_logging
from glassbox.telemetry.metrics import Metrics, MetricSpec, build_metrics
from glassbox.telemetry.observer import MetricsObserver
from glassbox.telemetry.setup import Telemetry, build_telemetry

__all__ = ["CompositeObserver", "MetricSpec", "Metrics", "MetricsObserver", "Telemetry", "build_metrics",
           "build_telemetry", "configure_logging"]
