"""deploy/otel: the collector's pipelines use only components it defines, in a safe order, and Tempo stores
locally and listens where the collector sends. (No collector or Tempo binary runs here; this is the structure.)"""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.tools import COMPOSE_FILE, OTEL_DIR, host_port, load_yaml

COMPONENT_KINDS = ("receivers", "processors", "exporters", "connectors")


@pytest.fixture(scope="module")
def collector() -> dict[str, Any]:
    config: dict[str, Any] = load_yaml(OTEL_DIR / "collector.yaml")
    return config


@pytest.fixture(scope="module")
def tempo() -> dict[str, Any]:
    config: dict[str, Any] = load_yaml(OTEL_DIR / "tempo.yaml")
    return config


def test_collector_pipelines_reference_defined_components(collector: dict[str, Any]) -> None:
    pipelines = collector["service"]["pipelines"]
    assert set(pipelines) == {"traces"}
    used: dict[str, set[str]] = {kind: set() for kind in COMPONENT_KINDS}
    for name, pipeline in pipelines.items():
        assert pipeline.get("receivers") and pipeline.get("exporters"), f"pipeline {name} is incomplete"
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in collector.get(kind, {}), f"pipeline {name}: {kind} {component} is not defined"
                used[kind].add(component)
    # A defined component no pipeline uses is a configuration mistake the collector only warns about.
    for kind in ("receivers", "processors", "exporters"):
        assert set(collector.get(kind, {})) == used[kind], kind
    for extension in collector["service"].get("extensions", []):
        assert extension in collector["extensions"]


def test_collector_receives_otlp_over_grpc_and_http_on_all_interfaces(collector: dict[str, Any]) -> None:
    protocols = collector["receivers"]["otlp"]["protocols"]
    assert {name: host_port(p["endpoint"]) for name, p in protocols.items()} == {
        "grpc": ("0.0.0.0", 4317),
        "http": ("0.0.0.0", 4318),
    }


def test_memory_limiter_runs_first_and_batch_last(collector: dict[str, Any]) -> None:
    processors = collector["service"]["pipelines"]["traces"]["processors"]
    assert processors[0] == "memory_limiter" and processors[-1] == "batch"
    limiter = collector["processors"]["memory_limiter"]
    assert limiter["check_interval"] and 0 < limiter["spike_limit_mib"] < limiter["limit_mib"]
    batch = collector["processors"]["batch"]
    assert batch["send_batch_size"] > 0 and batch["timeout"]


def test_collector_exports_plaintext_otlp_to_tempo(collector: dict[str, Any], tempo: dict[str, Any]) -> None:
    exporter = collector["exporters"]["otlp/tempo"]
    assert exporter["tls"]["insecure"] is True  # Tempo's receiver in compose has no TLS
    tempo_grpc = tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert host_port(exporter["endpoint"]) == ("tempo", host_port(tempo_grpc)[1])


def test_tempo_listens_on_all_interfaces_and_stores_in_its_volume(tempo: dict[str, Any]) -> None:
    for protocol in tempo["distributor"]["receivers"]["otlp"]["protocols"].values():
        assert host_port(protocol["endpoint"])[0] == "0.0.0.0"
    storage = tempo["storage"]["trace"]
    assert storage["backend"] == "local"
    services = load_yaml(COMPOSE_FILE)["services"]
    volume = next(v.split(":")[1] for v in services["tempo"]["volumes"] if v.startswith("tempo-data:"))
    for path in (storage["wal"]["path"], storage["local"]["path"]):
        assert path.startswith(volume + "/"), f"{path} is outside the tempo-data volume"
    # The init container hands that volume to Tempo's user before Tempo starts.
    init = services["tempo-init"]
    assert init["entrypoint"] == ["chown", "10001:10001", volume] and init["image"] == services["tempo"]["image"]
    assert tempo["compactor"]["compaction"]["block_retention"]


def test_tempo_serves_queries_where_compose_publishes_it(tempo: dict[str, Any]) -> None:
    services = load_yaml(COMPOSE_FILE)["services"]
    (mapping,) = services["tempo"]["ports"]
    assert int(mapping.rsplit(":", 1)[1]) == tempo["server"]["http_listen_port"]


def test_collector_health_endpoint_is_declared(collector: dict[str, Any]) -> None:
    assert host_port(collector["extensions"]["health_check"]["endpoint"]) == ("0.0.0.0", 13133)
    assert "health_check" in collector["service"]["extensions"]
