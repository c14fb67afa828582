"""benchmarks.frontend starts the server it measures: the null engine by default, the model on request."""

from __future__ import annotations

from pathlib import Path

from benchmarks.frontend import serve_command


def test_the_null_engine_needs_the_benchmark_flag_and_the_model_runs_with_the_servers_defaults() -> None:
    null = serve_command(Path("/m"), 2, 8123, ["--no-telemetry"], "null")
    assert null[null.index("--engine"):] == ["--engine", "null", "--benchmark", "--workers", "2", "--port", "8123",
                                             "--no-telemetry"]
    model = serve_command(Path("/m"), 8, 8124, [], "model")
    assert "--engine" not in model and "--benchmark" not in model and "--device" not in model
    assert model[model.index("--workers") + 1] == "8" and model[model.index("--model") + 1] == "/m"
