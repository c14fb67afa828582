"""Fixtures shared by the OTLP tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.telemetry.otlp_receiver import RECEIVERS, Receiver, grpc_available


@pytest.fixture(params=list(RECEIVERS))
def receiver(request: pytest.FixtureRequest) -> Iterator[tuple[str, Receiver]]:
    """A running receiver for each OTLP protocol (gRPC skipped where grpcio is missing), with the protocol's name."""
    if request.param == "grpc" and not grpc_available():
        pytest.skip("grpcio is not installed: OTLP/gRPC is not available")
    with RECEIVERS[request.param]() as running:
        yield request.param, running
