"""compose.yaml: valid for docker-compose, every mounted path present, and every address one service uses to reach
another agreeing with the file that configures the other (Prometheus, collector, Tempo, Grafana provisioning)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from glassbox.service.settings import load_settings
from tests.deploy.tools import (
    COMPOSE_FILE,
    OTEL_DIR,
    PROMETHEUS_DIR,
    ROOT,
    host_port,
    load_yaml,
    require_tool,
    run_tool,
)

GRAFANA = ROOT / "grafana"
COMPOSE_HINT = "apt-get install -y docker-compose"
PROFILES = {"cpu": "glassbox-cpu", "gpu": "glassbox-gpu"}
# Where each image listens; the compose file relies on these defaults instead of setting them.
DEFAULT_LISTEN = {"prometheus": 9090, "grafana": 3000, "alertmanager": 9093}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = load_yaml(COMPOSE_FILE)
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = compose["services"]
    return found


def glassbox_services(services: dict[str, Any]) -> list[dict[str, Any]]:
    return [services[name] for name in PROFILES.values()]


def bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(host path, container path) of each bind mount; named volumes are left out."""
    out = []
    for volume in service.get("volumes", []):
        source, target = str(volume).split(":")[:2]
        if source.startswith((".", "/")):
            out.append((source, target))
    return out


def mount_target(service: dict[str, Any], host_path: str) -> str:
    matches = [target for source, target in bind_mounts(service) if Path(source) == Path(host_path)]
    assert len(matches) == 1, f"{host_path} is not mounted exactly once"
    return matches[0]


def container_port(service: dict[str, Any]) -> int:
    (mapping,) = service["ports"]
    return int(str(mapping).rsplit(":", 1)[1].split("/")[0])


def datasources() -> dict[str, dict[str, Any]]:
    """Grafana's provisioned data sources by uid (grafana/provisioning/datasources/*.yaml)."""
    by_uid: dict[str, dict[str, Any]] = {}
    files = sorted((GRAFANA / "provisioning" / "datasources").glob("*.y*ml"))
    assert files, "no Grafana data source provisioning files"
    for path in files:
        for source in load_yaml(path).get("datasources", []):
            by_uid[source["uid"]] = source
    return by_uid


# --- the tool -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", [None, *PROFILES])
def test_docker_compose_accepts_the_file(profile: str | None) -> None:
    tool = require_tool("docker-compose", COMPOSE_HINT)
    args = [tool, "-f", str(COMPOSE_FILE), *(["--profile", profile] if profile else []), "config", "-q"]
    done = run_tool(args)
    assert done.returncode == 0, done.stderr


def test_docker_compose_rejects_an_unknown_option(tmp_path: Path) -> None:
    """The validation above can fail: the same file with one misspelt option does."""
    tool = require_tool("docker-compose", COMPOSE_HINT)
    broken = tmp_path / "compose.yaml"
    text = COMPOSE_FILE.read_text()
    assert "\n    healthcheck:\n" in text
    broken.write_text(text.replace("\n    healthcheck:\n", "\n    healthchek:\n", 1))
    done = run_tool([tool, "-f", str(broken), "config", "-q"])
    assert done.returncode != 0 and "healthchek" in done.stderr


# --- files ----------------------------------------------------------------------------------------------------------
def test_every_bind_mount_exists_in_the_repository(services: dict[str, Any]) -> None:
    mounts = [(name, source) for name, service in services.items() for source, _ in bind_mounts(service)]
    assert len(mounts) >= 5
    for name, source in mounts:
        assert not source.startswith("/"), f"{name}: absolute host path {source}"
        assert (ROOT / source).exists(), f"{name}: {source} does not exist"


def test_grafana_mounts_the_provisioning_and_the_dashboards_it_provisions(services: dict[str, Any]) -> None:
    grafana = services["grafana"]
    assert mount_target(grafana, "./grafana/provisioning") == "/etc/grafana/provisioning"
    dashboards_at = mount_target(grafana, "./grafana/dashboards")
    providers = [p for path in (GRAFANA / "provisioning" / "dashboards").glob("*.y*ml")
                 for p in load_yaml(path).get("providers", [])]
    assert providers and all(p["options"]["path"] == dashboards_at for p in providers)
    assert list((GRAFANA / "dashboards").glob("*.json")), "no dashboards to provision"


def test_prometheus_loads_the_config_and_rules_in_deploy(services: dict[str, Any]) -> None:
    prometheus = services["prometheus"]
    config_dir = mount_target(prometheus, "./deploy/prometheus")
    flags = dict(arg.split("=", 1) for arg in prometheus["command"] if "=" in arg)
    assert flags["--config.file"] == f"{config_dir}/prometheus.yml"
    assert flags["--enable-feature"] == "exemplar-storage"
    rule_globs = load_yaml(PROMETHEUS_DIR / "prometheus.yml")["rule_files"]
    found = [path for pattern in rule_globs for path in PROMETHEUS_DIR.glob(pattern)]
    assert {p.name for p in found} == {"recording.yml", "alerts.yml"}


def test_prometheus_sends_alerts_to_the_alertmanager_compose_runs(services: dict[str, Any]) -> None:
    alertmanager = services["alertmanager"]
    config_dir = mount_target(alertmanager, "./deploy/alertmanager")
    assert f"--config.file={config_dir}/alertmanager.yml" in alertmanager["command"]
    (target,) = [t for am in load_yaml(PROMETHEUS_DIR / "prometheus.yml")["alerting"]["alertmanagers"]
                 for config in am["static_configs"] for t in config["targets"]]
    assert host_port(target) == ("alertmanager", container_port(alertmanager))


def test_collector_and_tempo_get_their_config_files(services: dict[str, Any]) -> None:
    collector = services["otel-collector"]
    target = mount_target(collector, "./deploy/otel/collector.yaml")
    assert collector["command"] == [f"--config={target}"]
    tempo = services["tempo"]
    target = mount_target(tempo, "./deploy/otel/tempo.yaml")
    assert tempo["command"] == [f"-config.file={target}"]


# --- addresses ------------------------------------------------------------------------------------------------------
def test_prometheus_scrapes_glassbox_where_compose_puts_it(services: dict[str, Any]) -> None:
    config = load_yaml(PROMETHEUS_DIR / "prometheus.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    (target,) = jobs["glassbox"]["static_configs"][0]["targets"]
    host, port = host_port(target)
    for service in glassbox_services(services):
        assert host in service["networks"]["default"]["aliases"]
        assert port == container_port(service) == int(service["environment"]["GLASSBOX_PORT"])
    assert jobs["glassbox"].get("metrics_path", "/metrics") == "/metrics"


def test_prometheus_scrapes_the_collector_and_tempo_on_their_ports(services: dict[str, Any]) -> None:
    jobs = {job["job_name"]: job for job in load_yaml(PROMETHEUS_DIR / "prometheus.yml")["scrape_configs"]}
    collector = load_yaml(OTEL_DIR / "collector.yaml")
    (reader,) = collector["service"]["telemetry"]["metrics"]["readers"]
    own_metrics = reader["pull"]["exporter"]["prometheus"]
    assert host_port(jobs["otel-collector"]["static_configs"][0]["targets"][0]) == ("otel-collector",
                                                                                     own_metrics["port"])
    tempo = load_yaml(OTEL_DIR / "tempo.yaml")
    assert host_port(jobs["tempo"]["static_configs"][0]["targets"][0]) == ("tempo", tempo["server"]["http_listen_port"])
    for name in ("otel-collector", "tempo"):
        assert name in services


def test_glassbox_sends_traces_to_the_collector_receiver_for_its_protocol(services: dict[str, Any]) -> None:
    receivers = load_yaml(OTEL_DIR / "collector.yaml")["receivers"]["otlp"]["protocols"]
    for service in glassbox_services(services):
        env = service["environment"]
        host, port = host_port(env["GLASSBOX_OTLP_ENDPOINT"])
        assert host in services
        protocol = {"http/protobuf": "http", "grpc": "grpc"}[env["GLASSBOX_OTLP_PROTOCOL"]]
        assert port == host_port(receivers[protocol]["endpoint"])[1]
        assert service["depends_on"][host]["condition"] == "service_started"


def test_collector_exports_to_the_tempo_receiver(services: dict[str, Any]) -> None:
    collector = load_yaml(OTEL_DIR / "collector.yaml")
    tempo = load_yaml(OTEL_DIR / "tempo.yaml")
    (exporter,) = collector["service"]["pipelines"]["traces"]["exporters"]
    host, port = host_port(collector["exporters"][exporter]["endpoint"])
    assert host == "tempo" and host in services
    assert exporter.split("/")[0] == "otlp", "the otlp exporter speaks gRPC"
    assert port == host_port(tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])[1]


def test_grafana_data_sources_point_at_the_compose_services(services: dict[str, Any]) -> None:
    sources = datasources()
    tempo_port = load_yaml(OTEL_DIR / "tempo.yaml")["server"]["http_listen_port"]
    expected = {"prometheus": ("prometheus", DEFAULT_LISTEN["prometheus"]), "tempo": ("tempo", tempo_port),
                "alertmanager": ("alertmanager", DEFAULT_LISTEN["alertmanager"])}
    for uid, (service, port) in expected.items():
        assert sources[uid]["type"] == uid
        assert host_port(sources[uid]["url"]) == (service, port)
        assert service in services
    assert container_port(services["prometheus"]) == DEFAULT_LISTEN["prometheus"]
    assert container_port(services["tempo"]) == tempo_port


def test_grafana_links_exemplars_to_tempo_by_the_trace_id_label() -> None:
    sources = datasources()
    links = sources["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert {(link["name"], link["datasourceUid"]) for link in links} == {("trace_id", "tempo")}
    # The exemplar label glassbox writes (docs/metrics.md, "Exemplars").
    assert '{trace_id="…"}' in (ROOT / "docs" / "metrics.md").read_text()


def test_health_checks_ask_the_port_each_service_listens_on(services: dict[str, Any]) -> None:
    for name, port in DEFAULT_LISTEN.items():
        test = services[name]["healthcheck"]["test"]
        urls = [word for word in test if word.startswith("http://")]
        assert len(urls) == 1 and host_port(urls[0])[1] == port == container_port(services[name])


# --- profiles and start order -----------------------------------------------------------------------------------------
def test_profiles_build_the_matching_variant_and_device(services: dict[str, Any]) -> None:
    for profile, name in PROFILES.items():
        service = services[name]
        variant = "cuda" if profile == "gpu" else "cpu"
        assert service["profiles"] == [profile]
        assert service["build"]["args"]["VARIANT"] == variant
        assert service["environment"]["GLASSBOX_DEVICE"] == ("cuda" if profile == "gpu" else "cpu")
        model = services[f"model-{profile}"]
        assert model["profiles"] == [profile] and model["image"] == service["image"]
    (device,) = services["glassbox-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["count"] == 1 and device["capabilities"] == ["gpu"]
    assert "deploy" not in services["glassbox-cpu"]
    unprofiled = [name for name, s in services.items() if "profiles" not in s]
    assert set(unprofiled) == {"prometheus", "alertmanager", "grafana", "otel-collector", "tempo", "tempo-init"}


def interpolate(value: str, shell: dict[str, str]) -> str:
    """`${NAME:-default}` and `${NAME}` as compose resolves them from the shell that runs it."""
    def one(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(3) or ""
        return shell.get(name) or default
    return re.sub(r"\$\{([A-Z_][A-Z0-9_]*)(:-([^}]*))?\}", one, value)


@pytest.mark.parametrize("shell", [{}, {"GLASSBOX_CHAOS": "true", "GLASSBOX_CHAOS_TOKEN": "t0ken"}],
                         ids=["plain", "chaos-on"])
def test_glassbox_settings_are_valid(services: dict[str, Any], shell: dict[str, str]) -> None:
    for service in glassbox_services(services):
        env = {k: interpolate(str(v), shell) for k, v in service["environment"].items()}
        assert all(k.startswith("GLASSBOX_") for k in env)
        settings = load_settings(environ=env)
        assert settings.host == "0.0.0.0"
        # Chaos is off unless the shell turns it on, and then the token comes through too.
        assert settings.chaos is bool(shell)
        assert env["GLASSBOX_CHAOS_TOKEN"] == shell.get("GLASSBOX_CHAOS_TOKEN", "")
        # The model lives in the volume the model-* service builds it into.
        volume_target = next(v.split(":")[1] for v in service["volumes"] if v.startswith("models:"))
        assert settings.model.startswith(volume_target + "/")


def test_model_build_writes_where_glassbox_reads(services: dict[str, Any]) -> None:
    for profile, name in PROFILES.items():
        command = services[f"model-{profile}"]["command"]
        assert command[:2] == ["model", "build"] and "--if-missing" in command
        assert command[command.index("--out") + 1] == services[name]["environment"]["GLASSBOX_MODEL"]


def test_drain_finishes_before_docker_kills(services: dict[str, Any]) -> None:
    for service in glassbox_services(services):
        grace = re.fullmatch(r"(\d+)s", service["stop_grace_period"])
        assert grace is not None
        assert int(grace.group(1)) > float(service["environment"]["GLASSBOX_DRAIN_TIMEOUT_S"])


def test_a_dead_glassbox_exits_and_docker_starts_it_again(services: dict[str, Any]) -> None:
    """Docker restarts on exit, never on a failed health check: a dead glassbox must leave by itself."""
    for service in glassbox_services(services):
        settings = load_settings(environ={k: str(v) for k, v in service["environment"].items() if "${" not in str(v)})
        assert settings.exit_when_dead_s > 0 and service["restart"] in ("always", "unless-stopped", "on-failure")


def test_depends_on_conditions_can_be_met(services: dict[str, Any]) -> None:
    seen = set()
    for name, service in services.items():
        for other, rule in service.get("depends_on", {}).items():
            condition = rule["condition"]
            seen.add(condition)
            if condition == "service_healthy":
                assert "healthcheck" in services[other], f"{name} waits for {other} to be healthy: it has no check"
            if condition == "service_completed_successfully":
                assert services[other]["restart"] == "no", f"{name} waits for {other} to exit, but it restarts"
            if "profiles" in services[other]:
                assert services[other]["profiles"] == service.get("profiles"), f"{name} -> {other}: profiles"
    assert seen == {"service_started", "service_healthy", "service_completed_successfully"}


def test_images_are_pinned_and_ports_stay_on_localhost(services: dict[str, Any]) -> None:
    for name, service in services.items():
        image = service["image"]
        if "build" not in service:
            assert ":" in image and not image.endswith(":latest"), f"{name}: {image} is not pinned"
        for mapping in service.get("ports", []):
            assert str(mapping).startswith("127.0.0.1:"), f"{name} publishes {mapping} beyond this machine"
