"""deploy/k8s: built-in kinds validated by kubernetes-validate --strict (oldest supported and newest Kubernetes),
the ServiceMonitor and ScaledObject strictly against models of their own CRDs, and the manifests agreeing with
each other, with the settings, the Dockerfile and the metric catalogue."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from glassbox.service.settings import field_names, load_settings
from tests.deploy.crd import validate_strict
from tests.deploy.promql import catalogue, problems
from tests.deploy.tools import (
    DOCKERFILE,
    K8S_DIR,
    PROMETHEUS_DIR,
    ROOT,
    load_yaml,
    load_yaml_all,
    require_module,
    require_tool,
    run_tool,
)

VALIDATE_HINT = "pip install kubernetes-validate (the dev extra)"
CRD_HINT = "pip install cloudcoil-models-keda cloudcoil-models-prometheus-operator (the dev extra)"
OLDEST_KUBERNETES = "1.29"  # docs/deploy.md promises this and newer
# KEDA applies a ScaledObject's fallback to triggers of metricType Value only from 2.18 on; before, its admission
# webhook refuses a fallback beside such a trigger and its operator leaves them out of the fallback.
KEDA_FALLBACK_FOR_VALUE = (2, 18)
BUILT_IN = {"Namespace", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
CUSTOM = {"ServiceMonitor", "ScaledObject"}


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict[str, Any]]:
    """kind -> the one resource of that kind."""
    found: dict[str, dict[str, Any]] = {}
    for path in resource_files():
        for doc in load_yaml_all(path):
            assert doc["kind"] not in found, f"two {doc['kind']} resources"
            found[doc["kind"]] = doc
    assert set(found) == BUILT_IN | CUSTOM
    return found


def resource_files() -> list[Path]:
    return sorted(p for p in K8S_DIR.glob("*.yaml") if p.name != "kustomization.yaml")


def container(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (only,) = manifests["Deployment"]["spec"]["template"]["spec"]["containers"]
    found: dict[str, Any] = only
    return found


def settings_data(manifests: dict[str, dict[str, Any]]) -> dict[str, str]:
    data: dict[str, str] = manifests["ConfigMap"]["data"]
    return data


# --- schemas --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, None], ids=["oldest", "newest"])
def test_built_in_kinds_pass_kubernetes_validate_strict(version: str | None) -> None:
    tool = require_tool("kubernetes-validate", VALIDATE_HINT)
    files = [p for p in resource_files() if load_yaml_all(p)[0]["kind"] in BUILT_IN]
    assert len(files) == len(BUILT_IN)
    done = run_tool([tool, "--strict", *(["-k", version] if version else []), *map(str, files)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" passed for resource ") == len(BUILT_IN), done.stdout
    assert "WARN" not in done.stdout, done.stdout


def test_kubernetes_validate_rejects_an_unknown_field(tmp_path: Path) -> None:
    """The strict check can fail: a misspelt field in the Deployment is an error."""
    tool = require_tool("kubernetes-validate", VALIDATE_HINT)
    broken = tmp_path / "deployment.yaml"
    broken.write_text((K8S_DIR / "deployment.yaml").read_text().replace("enableServiceLinks", "enableServiceLink"))
    done = run_tool([tool, "--strict", str(broken)])
    assert done.returncode != 0 and "enableServiceLink" in done.stdout


def test_service_monitor_matches_the_prometheus_operator_schema(manifests: dict[str, dict[str, Any]]) -> None:
    require_module("cloudcoil.models.prometheus_operator", CRD_HINT)
    from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor

    validate_strict(ServiceMonitor, manifests["ServiceMonitor"])


def test_scaled_object_matches_the_keda_schema(manifests: dict[str, dict[str, Any]]) -> None:
    require_module("cloudcoil.models.keda", CRD_HINT)
    from cloudcoil.models.keda.v1alpha1 import ScaledObject

    validate_strict(ScaledObject, manifests["ScaledObject"])
    # KEDA's CRD types metricType as any string; its admission webhook allows these (and a fallback beside a Value
    # trigger from 2.18 on: test_docs_ask_for_a_keda_that_takes_this_scaled_object).
    for trigger in manifests["ScaledObject"]["spec"]["triggers"]:
        assert trigger["metricType"] in {"AverageValue", "Value", "Utilization"}


def test_docs_ask_for_a_keda_that_takes_this_scaled_object(manifests: dict[str, dict[str, Any]]) -> None:
    """The CRD schema takes a fallback beside a Value trigger, but KEDA before 2.18 does not: its webhook refuses the
    ScaledObject, and its operator falls back on AverageValue triggers only. docs/deploy.md must ask for 2.18."""
    scaled = manifests["ScaledObject"]["spec"]
    needed = (2, 0)
    if "fallback" in scaled and any(t.get("metricType") == "Value" for t in scaled["triggers"]):
        needed = KEDA_FALLBACK_FOR_VALUE
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    asked = re.search(r"\bKEDA (\d+)\.(\d+) or newer\b", deploy)
    assert asked is not None, "docs/deploy.md names no KEDA version (`KEDA X.Y or newer`)"
    assert (int(asked.group(1)), int(asked.group(2))) >= needed, (asked.group(0), needed)


def test_strict_crd_validation_rejects_an_unknown_field(manifests: dict[str, dict[str, Any]]) -> None:
    require_module("cloudcoil.models.keda", CRD_HINT)
    from cloudcoil.models.keda.v1alpha1 import ScaledObject

    broken = {**manifests["ScaledObject"], "spec": {**manifests["ScaledObject"]["spec"], "minReplicas": 2}}
    with pytest.raises(AssertionError, match=r"\.spec\.minReplicas"):
        validate_strict(ScaledObject, broken)


def test_kustomization_lists_every_resource_and_the_deployment_image(manifests: dict[str, dict[str, Any]]) -> None:
    kustomization = load_yaml(K8S_DIR / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(p.name for p in resource_files())
    assert kustomization["namespace"] == manifests["Namespace"]["metadata"]["name"]
    (image,) = kustomization["images"]
    assert container(manifests)["image"].rsplit(":", 1)[0] == image["name"]


# --- settings -------------------------------------------------------------------------------------------------------
def test_config_map_holds_valid_glassbox_settings(manifests: dict[str, dict[str, Any]]) -> None:
    data = settings_data(manifests)
    known = {"GLASSBOX_" + name.upper() for name in field_names()}
    assert set(data) <= known, f"not glassbox settings: {set(data) - known}"
    settings = load_settings(environ=data)
    assert settings.host == "0.0.0.0" and settings.device == "cuda" and settings.cpu_fallback
    (env_from,) = container(manifests)["envFrom"]
    assert env_from["configMapRef"]["name"] == manifests["ConfigMap"]["metadata"]["name"]


def test_the_deployed_latency_slo_is_the_one_the_rules_judge(manifests: dict[str, dict[str, Any]]) -> None:
    """The server keeps the trace of every request slower than its latency SLO; the recording rules count a request
    slow past their `le` boundary. The two must name one threshold, or the traces kept are not the requests the
    latency alerts count."""
    slo_s = load_settings(environ=settings_data(manifests)).latency_slo_ms / 1000
    rules = (PROMETHEUS_DIR / "rules" / "recording.yml").read_text()
    judged = set(re.findall(r'glassbox_request_duration_seconds_bucket\{[^}]*le="([\d.]+)"', rules))
    assert judged == {f"{slo_s:g}"}


def test_service_links_cannot_shadow_settings(manifests: dict[str, dict[str, Any]]) -> None:
    """Kubernetes would inject GLASSBOX_PORT=tcp://... for a Service named glassbox; the setting must win."""
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    assert manifests["Service"]["metadata"]["name"].upper().replace("-", "_") + "_" == "GLASSBOX_"
    assert pod["enableServiceLinks"] is False


def test_container_runs_as_the_image_user(manifests: dict[str, dict[str, Any]]) -> None:
    image_user = re.search(r"^USER (\d+)", DOCKERFILE.read_text(), re.MULTILINE)
    assert image_user is not None
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert str(pod["securityContext"]["runAsUser"]) == image_user.group(1)
    security = container(manifests)["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in container(manifests)["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in container(manifests)["env"]}
    assert "/tmp" in mounts and env["HOME"].startswith("/tmp")


def test_the_pod_tells_glassbox_who_it_is_for_the_traces_resource(manifests: dict[str, dict[str, Any]]) -> None:
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container(manifests)["env"]}
    assert {name: env.get(name) for name in ("POD_IP", "POD_NAME", "POD_NAMESPACE")} == {
        "POD_IP": "status.podIP", "POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}


# --- probes, drain, GPU ---------------------------------------------------------------------------------------------
def test_probes_ask_the_right_endpoints_on_the_serving_port(manifests: dict[str, dict[str, Any]]) -> None:
    c = container(manifests)
    (port,) = c["ports"]
    assert port["containerPort"] == int(settings_data(manifests)["GLASSBOX_PORT"])
    paths = {probe: c[probe]["httpGet"]["path"] for probe in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert paths == {"startupProbe": "/readyz", "readinessProbe": "/readyz", "livenessProbe": "/livez"}
    for probe in paths:
        assert c[probe]["httpGet"]["port"] == port["name"]


def test_startup_probe_allows_for_model_load_and_graph_capture(manifests: dict[str, dict[str, Any]]) -> None:
    c = container(manifests)
    startup = c["startupProbe"]
    budget_s = startup["periodSeconds"] * startup["failureThreshold"]
    assert budget_s >= 300, "model load + CUDA graph capture + CPU fallback warm-up can take minutes"
    liveness = c["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] < budget_s


def test_a_rollout_waits_for_a_replica_as_long_as_its_startup_probe_does(manifests: dict[str, dict[str, Any]]) -> None:
    """The Deployment's progress deadline runs from the pod's creation (scheduling and a multi-GB image pull included)
    and the startup probe's budget from the container's start: with the default deadline (600 s) a replica still
    within its startup budget marked the rollout failed."""
    startup = container(manifests)["startupProbe"]
    budget_s = startup["periodSeconds"] * startup["failureThreshold"]
    deadline_s = manifests["Deployment"]["spec"].get("progressDeadlineSeconds", 600)
    assert deadline_s >= budget_s + 120, (deadline_s, budget_s)


def test_grace_period_covers_pre_stop_sleep_and_drain(manifests: dict[str, dict[str, Any]]) -> None:
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    command = container(manifests)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop_s = int(command[1])
    drain_s = float(settings_data(manifests)["GLASSBOX_DRAIN_TIMEOUT_S"])
    assert pre_stop_s >= 5, "endpoint removal needs a few seconds to reach every proxy"
    assert pod["terminationGracePeriodSeconds"] > pre_stop_s + drain_s


def test_one_gpu_per_replica_and_rollouts_never_lose_capacity(manifests: dict[str, dict[str, Any]]) -> None:
    resources = container(manifests)["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1
    assert resources["limits"]["memory"] == resources["requests"]["memory"]
    threads = int(settings_data(manifests)["GLASSBOX_THREADS"])
    assert threads == int(resources["requests"]["cpu"])
    spec = manifests["Deployment"]["spec"]
    assert "replicas" not in spec, "the autoscaler owns the replica count"
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    tolerations = spec["template"]["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations


# --- selectors ------------------------------------------------------------------------------------------------------
def test_selectors_find_the_pods_and_the_service(manifests: dict[str, dict[str, Any]]) -> None:
    pod_labels = manifests["Deployment"]["spec"]["template"]["metadata"]["labels"]
    service = manifests["Service"]

    def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
        return bool(selector) and all(labels.get(k) == v for k, v in selector.items())

    assert selects(manifests["Deployment"]["spec"]["selector"]["matchLabels"], pod_labels)
    assert selects(service["spec"]["selector"], pod_labels)
    assert selects(manifests["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"], pod_labels)
    assert selects(manifests["ServiceMonitor"]["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == container(manifests)["ports"][0]["name"]
    (endpoint,) = manifests["ServiceMonitor"]["spec"]["endpoints"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"


def test_scrape_job_is_the_one_the_alert_rules_select(manifests: dict[str, dict[str, Any]]) -> None:
    """The Prometheus Operator names the job after the Service; rules/alerts.yml selects job="glassbox"."""
    alerts = (PROMETHEUS_DIR / "rules" / "alerts.yml").read_text()
    assert set(re.findall(r'job="([^"]+)"', alerts)) == {manifests["Service"]["metadata"]["name"]}
    assert "jobLabel" not in manifests["ServiceMonitor"]["spec"]


# --- autoscaling and disruptions ------------------------------------------------------------------------------------
def test_scaled_object_reads_glassbox_metrics_of_this_service(manifests: dict[str, dict[str, Any]]) -> None:
    scaled = manifests["ScaledObject"]["spec"]
    assert scaled["scaleTargetRef"]["name"] == manifests["Deployment"]["metadata"]["name"]
    namespace = load_yaml(K8S_DIR / "kustomization.yaml")["namespace"]
    service = manifests["Service"]["metadata"]["name"]
    specs = catalogue()
    triggers = scaled["triggers"]
    assert {t["type"] for t in triggers} == {"prometheus"}
    for trigger in triggers:
        query = trigger["metadata"]["query"]
        assert not problems(query, specs, {}), problems(query, specs, {})
        assert set(re.findall(r'namespace="([^"]+)"', query)) == {namespace}
        assert set(re.findall(r'service="([^"]+)"', query)) == {service}
        assert trigger["metadata"]["ignoreNullValues"] == "false", "no data must not read as no load"
        float(trigger["metadata"]["threshold"])
    inflight = next(t for t in triggers if "glassbox_inflight_requests" in t["metadata"]["query"])
    assert inflight["metricType"] == "AverageValue"  # per replica
    # Scale out long before a replica's queue refuses work with 429.
    assert float(inflight["metadata"]["threshold"]) <= int(settings_data(manifests)["GLASSBOX_MAX_QUEUE_REQUESTS"]) / 4


def test_disruption_budget_leaves_a_replica_serving(manifests: dict[str, dict[str, Any]]) -> None:
    scaled = manifests["ScaledObject"]["spec"]
    budget = manifests["PodDisruptionBudget"]["spec"]
    assert budget["maxUnavailable"] < scaled["minReplicaCount"] <= scaled["fallback"]["replicas"]
    assert scaled["fallback"]["replicas"] <= scaled["maxReplicaCount"]
    assert budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
