"""The Grafana dashboards and provisioning, offline: structure, data source references, metric names against the
catalogue, the panels docs/runbook.md points at, and Grafana's own TypeScript schema (grafana/schema-check).

Running the queries against a real Prometheus is tests/grafana/test_prometheus_panels.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from glassbox.telemetry.metrics import build_metrics
from tests.grafana.dashboards import (
    DASHBOARDS,
    PROVISIONING,
    ROOT,
    SCHEMA_CHECK,
    TITLES,
    load_dashboards,
    metric_names,
    panels,
    provisioned_datasources,
    queries,
    require_tool,
    visual_panels,
)

NPM_TIMEOUT_S = 300  # a cold `npm ci` downloads two packages; tsc itself takes seconds
DASHBOARD_MOUNT = "/var/lib/grafana/dashboards"  # where compose.yaml mounts grafana/dashboards

# What docs/runbook.md tells the reader to look at, as (dashboard, metric a panel there must query).
RUNBOOK_PANELS = [
    ("glassbox / Model", "glassbox_prediction_drift"),  # "Drift by distribution"
    ("glassbox / Model", "glassbox_predictions_total"),  # "Label shares against the reference"
    ("glassbox / Model", "glassbox_prediction_score"),  # "Confidence"
    ("glassbox / Model", "glassbox_input_tokens"),  # "Text length"
    ("glassbox / Overview", "glassbox_request_duration_seconds"),  # request latency by route
    ("glassbox / Overview", "glassbox_requests_total"),  # status codes
    ("glassbox / Overview", "glassbox_http_aborted_total"),  # "Overview (or Process): aborted connections"
    ("glassbox / Stages", "glassbox_stage_duration_seconds"),  # per-stage P99, tokenize P99
    ("glassbox / Batching", "glassbox_batch_padding_ratio"),
    ("glassbox / Batching", "glassbox_batch_size"),
    ("glassbox / Batching", "glassbox_queue_max_requests"),
    ("glassbox / Batching", "glassbox_queue_requests"),
    ("glassbox / Batching", "glassbox_queue_max_tokens"),
    ("glassbox / Batching", "glassbox_queue_tokens"),
    ("glassbox / Batching", "glassbox_engine_busy_seconds_total"),
    ("glassbox / Batching", "glassbox_rejected_total"),
    ("glassbox / Batching", "glassbox_dropped_total"),
    ("glassbox / Device", "glassbox_engine_runs_total"),
    ("glassbox / Device", "glassbox_gpu_memory_used_bytes"),
    ("glassbox / Device", "glassbox_gpu_memory_total_bytes"),
    ("glassbox / Device", "glassbox_torch_memory_reserved_bytes"),
    ("glassbox / Device", "glassbox_torch_memory_allocated_bytes"),
    ("glassbox / Device", "glassbox_torch_memory_fragmentation_ratio"),
    ("glassbox / Device", "glassbox_torch_alloc_retries_total"),
    ("glassbox / Process", "process_cpu_seconds_total"),
    ("glassbox / Process", "glassbox_event_loop_lag_seconds"),
    ("glassbox / Process", "process_resident_memory_bytes"),
    ("glassbox / Degradation & chaos", "glassbox_fallback_active"),
    ("glassbox / Degradation & chaos", "glassbox_fallback_events_total"),
    ("glassbox / Degradation & chaos", "glassbox_gpu_oom_total"),
    ("glassbox / Degradation & chaos", "glassbox_chaos_fault_active"),
    ("glassbox / Degradation & chaos", "glassbox_requests_by_device_total"),
    ("glassbox / Degradation & chaos", "glassbox_engine_runs_total"),
]

DASHBOARD_FILES = sorted(TITLES)


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict[str, Any]]:
    return load_dashboards()


def known_metrics() -> set[str]:
    """Every series name glassbox exports: the catalogue (histograms with their suffixes) and the client
    library's process/GC/platform collectors."""
    registry = CollectorRegistry()
    metrics = build_metrics(registry)
    names = set()
    for spec in metrics.catalogue:
        names.add(spec.name)
        if spec.kind == "histogram":
            names.update(spec.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    names.update(sample.name for family in registry.collect() for sample in family.samples)
    return names


# --- structure ---------------------------------------------------------------------------------------------------
def test_the_dashboards_exist_with_their_titles_and_unique_uids(dashboards: dict[str, dict[str, Any]]) -> None:
    assert {name: d["title"] for name, d in dashboards.items()} == TITLES
    uids = [d["uid"] for d in dashboards.values()]
    assert len(set(uids)) == len(uids) and all(uids)
    for dashboard in dashboards.values():
        assert isinstance(dashboard["schemaVersion"], int)
        assert dashboard.get("id") is None, "a provisioned dashboard carries no database id"


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_panels_have_unique_ids_titles_units_and_a_known_data_source(
    dashboards: dict[str, dict[str, Any]], name: str
) -> None:
    dashboard = dashboards[name]
    uids = data_source_uids(dashboard)
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {name}: {sorted(ids)}"
    titles = [panel["title"] for panel in visual_panels(dashboard)]
    assert len(titles) == len(set(titles)), f"duplicate panel titles in {name}"
    for panel in visual_panels(dashboard):
        where = f"{name} › {panel['title']!r}"
        assert panel["title"].strip(), f"{name}: panel {panel['id']} has no title"
        assert panel.get("description", "").strip(), f"{where} has no description"
        assert panel["datasource"]["uid"] in uids, f"{where}: data source {panel['datasource']} not provisioned"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{where} has no unit"
        assert panel["targets"], f"{where} has no query"
        for target in panel["targets"]:
            assert target["expr"].strip(), f"{where} › {target.get('refId')}: empty expr"
            assert target["datasource"]["uid"] in uids, f"{where} › {target['refId']}: unknown data source"
            assert target["refId"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), f"{where}: duplicate refIds"
        assert all(key in panel["gridPos"] for key in ("x", "y", "w", "h"))
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, f"{where} is wider than the grid"


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_every_query_names_only_metrics_that_glassbox_exports(
    dashboards: dict[str, dict[str, Any]], name: str
) -> None:
    known = known_metrics()
    for query in queries(dashboards[name]):
        assert query.expr.strip(), f"{query.where}: empty query"
        unknown = metric_names(query.expr) - known
        assert not unknown, f"{query.where}: not in the catalogue: {sorted(unknown)}"


GRAFANA_ITSELF = "-- Grafana --"  # the built-in data source of annotations stored in Grafana
DATASOURCE_VARIABLE = "${datasource}"
# Every dashboard offers these, in this order, and its queries use them: the data source, then job, model and instance
# chained (instance's "All" is the instances of the chosen jobs and models, so the model narrows every query).
COMMON_VARIABLES = ["datasource", "job", "model", "instance"]
FILTER = 'job=~"$job", instance=~"$instance"'


def data_source_uids(dashboard: dict[str, Any]) -> set[str]:
    """The uids a dashboard may reference: the provisioned ones, and its Prometheus data source variable."""
    uids = set(provisioned_datasources())
    if any(v["type"] == "datasource" and v["query"] == "prometheus" for v in dashboard["templating"]["list"]):
        uids.add(DATASOURCE_VARIABLE)
    return uids


def prometheus_refs(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if node.get("type") == "prometheus" and "uid" in node:
            yield node
        for value in node.values():
            yield from prometheus_refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from prometheus_refs(value)


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_prometheus_is_chosen_by_a_variable_and_job_model_instance_narrow_every_query(
    dashboards: dict[str, dict[str, Any]], name: str
) -> None:
    dashboard = dashboards[name]
    variables = dashboard["templating"]["list"]
    assert [v["name"] for v in variables[:4]] == COMMON_VARIABLES, name
    source = variables[0]
    assert (source["type"], source["query"], source["current"]["value"]) == ("datasource", "prometheus", "prometheus")
    assert sources_in(provisioned_datasources(), source["current"]["value"])
    refs = list(prometheus_refs(dashboard))
    assert refs and all(ref["uid"] == DATASOURCE_VARIABLE for ref in refs), f"{name}: a hard-coded Prometheus uid"
    by_name = {v["name"]: v for v in variables}
    assert by_name["model"]["query"] == 'label_values(glassbox_build_info{job=~"$job"}, model)'
    assert by_name["instance"]["query"] == 'label_values(glassbox_build_info{job=~"$job", model=~"$model"}, instance)'
    assert "allValue" not in by_name["instance"], "instance's All must be the instances found, or $model is ignored"
    for query in queries(dashboard):
        if query.source == "variable" or not metric_names(query.expr):  # ALERTS (the SLO alert list) has no job
            continue
        selectors = re.findall(r"\b(?:glassbox|process|python)_[a-z0-9_]+(\{[^}]*\})?", query.expr)
        assert selectors and all(FILTER in selector for selector in selectors), f"{query.where}: {query.expr}"


def sources_in(sources: dict[str, dict[str, Any]], uid: str) -> bool:
    return uid in sources and sources[uid]["type"] == "prometheus"


def test_annotations_and_variables_reference_provisioned_sources(dashboards: dict[str, dict[str, Any]]) -> None:
    for dashboard in dashboards.values():
        uids = data_source_uids(dashboard)
        for annotation in dashboard["annotations"]["list"]:
            if annotation.get("builtIn"):
                continue
            if annotation["datasource"]["uid"] == GRAFANA_ITSELF:
                # Annotations posted to Grafana's API (glassbox chaos run --grafana-url), selected by their tags.
                assert annotation["target"]["type"] == "tags" and annotation["target"]["tags"], annotation["name"]
                continue
            assert annotation["datasource"]["uid"] in uids, annotation["name"]
            assert annotation["target"]["expr"].strip(), annotation["name"]
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                assert variable["datasource"]["uid"] in uids, variable["name"]
    reference = [a for a in dashboards["degradation.json"]["annotations"]["list"] if not a.get("builtIn")]
    for name, dashboard in dashboards.items():
        listed = dashboard["annotations"]["list"]
        annotated = set().union(*(metric_names(a["target"]["expr"]) for a in listed if "expr" in a.get("target", {})))
        assert {"glassbox_fallback_active", "glassbox_chaos_fault_active"} <= annotated, name
        posted = [a["target"]["tags"] for a in listed
                  if a["datasource"]["uid"] == GRAFANA_ITSELF and not a.get("builtIn")]
        assert posted == [["glassbox", "chaos"]], f"{name}: the chaos runner's annotations (tags glassbox, chaos)"
        # Fallback and chaos marks read the same on every dashboard: one definition, copied.
        assert [a for a in listed if not a.get("builtIn")] == reference, name


def test_p99_request_panels_show_successful_requests_only(dashboards: dict[str, dict[str, Any]]) -> None:
    """Fast 429s during an overload pull a P99 of all answers down just when the service is slowest."""
    checked = 0
    for dashboard in dashboards.values():
        for query in queries(dashboard):
            if query.source == "panel" and "histogram_quantile" in query.expr and \
                    "glassbox_request_duration_seconds_bucket" in query.expr:
                assert 'status_class="2xx"' in query.expr, query.where
                checked += 1
    assert checked >= 4


def test_overview_and_degradation_stats_use_the_slo_definitions(dashboards: dict[str, dict[str, Any]]) -> None:
    """As deploy/prometheus/rules/recording.yml defines the SLIs: 5xx and 429 fail, other 4xx count on neither side;
    latency is judged on 2xx answers."""
    for name in ("overview.json", "degradation.json"):
        stats = [q for q in queries(dashboards[name]) if q.source == "panel" and "Availability" in q.title]
        assert stats, name
        for stat in stats:
            assert 'status=~"5..|429"' in stat.expr and 'status=~"[1235]..|429"' in stat.expr, stat.where
            assert 'status!~"5.."' not in stat.expr, stat.where
    latency = [q for q in queries(dashboards["overview.json"]) if q.source == "panel" and 'le="0.25"' in q.expr]
    assert latency and all(q.expr.count('status_class="2xx"') == 2 for q in latency)


def test_the_panels_the_runbook_points_at_exist(dashboards: dict[str, dict[str, Any]]) -> None:
    by_title = {d["title"]: d for d in dashboards.values()}
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    for title in TITLES.values():
        assert f"**{title}**" in runbook, f"docs/runbook.md does not name {title!r}"
    missing = []
    for title, metric in RUNBOOK_PANELS:
        exprs = [t["expr"] for p in visual_panels(by_title[title]) for t in p["targets"]]
        if not any(metric in metric_names(expr) or metric + "_bucket" in metric_names(expr) for expr in exprs):
            missing.append((title, metric))
    assert not missing, f"the runbook points at panels these dashboards lack: {missing}"
    # Every metric the runbook's PromQL uses is plotted somewhere.
    runbook_queries = "\n".join(re.findall(r"```promql\n(.*?)```", runbook, flags=re.S))
    plotted = set().union(*(metric_names(q.expr) for d in dashboards.values() for q in queries(d)))
    plotted |= {name.removesuffix("_bucket") for name in plotted}
    unplotted = metric_names(runbook_queries) - plotted
    assert not unplotted, f"metrics in the runbook's queries that no panel plots: {sorted(unplotted)}"


# --- provisioning ------------------------------------------------------------------------------------------------
def test_datasources_link_exemplars_to_tempo() -> None:
    sources = provisioned_datasources()
    assert sources["prometheus"]["type"] == "prometheus"
    assert sources["tempo"]["type"] == "tempo"
    links = sources["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert {"name": "trace_id", "datasourceUid": "tempo"} in links
    assert [s["uid"] for s in sources.values() if s.get("isDefault")] == ["prometheus"]


def test_dashboard_provider_reads_the_mounted_folder() -> None:
    (path,) = sorted((PROVISIONING / "dashboards").glob("*.y*ml"))
    (provider,) = yaml.safe_load(path.read_text())["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == DASHBOARD_MOUNT
    compose = ROOT / "compose.yaml"
    if compose.is_file():  # the local stack mounts grafana/dashboards there
        assert f"./grafana/dashboards:{DASHBOARD_MOUNT}" in compose.read_text()


# --- Grafana's schema (npm @grafana/schema + typescript) -----------------------------------------------------------
@pytest.fixture(scope="module")
def schema_check() -> Path:
    """grafana/schema-check with its pinned packages installed (node_modules is git-ignored there)."""
    npm = require_tool("npm")
    require_tool("node")
    if installed_versions() != pinned_versions():
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=SCHEMA_CHECK, capture_output=True,
                              text=True, timeout=NPM_TIMEOUT_S)
        assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
    return SCHEMA_CHECK


def pinned_versions() -> dict[str, str]:
    return dict(json.loads((SCHEMA_CHECK / "package.json").read_text())["devDependencies"])


def installed_versions() -> dict[str, str]:
    found = {}
    for name in pinned_versions():
        manifest = SCHEMA_CHECK / "node_modules" / name / "package.json"
        if manifest.is_file():
            found[name] = json.loads(manifest.read_text())["version"]
    return found


def run_check(schema_check: Path, dashboard_dir: Path, out_dir: Path, tsconfig: Path | None) -> str:
    """Generate the typed files for `dashboard_dir` into `out_dir` and type-check them; tsc's output on failure."""
    generate = subprocess.run(["node", "generate.mjs", str(dashboard_dir), str(out_dir)], cwd=schema_check,
                              capture_output=True, text=True, timeout=NPM_TIMEOUT_S)
    assert generate.returncode == 0, generate.stderr
    tsc = [str(schema_check / "node_modules" / ".bin" / "tsc"), "--noEmit", "-p", str(tsconfig or schema_check)]
    done = subprocess.run(tsc, cwd=schema_check, capture_output=True, text=True, timeout=NPM_TIMEOUT_S)
    return "" if done.returncode == 0 else done.stdout + done.stderr


def test_the_schema_is_pinned_to_the_grafana_that_renders_the_dashboards() -> None:
    pinned = pinned_versions()["@grafana/schema"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", pinned), f"pin @grafana/schema exactly, not {pinned!r}"
    compose = ROOT / "compose.yaml"
    if compose.is_file():
        images = re.findall(r"image:\s*grafana/grafana:(\S+)", compose.read_text())
        assert images == [pinned], f"compose.yaml runs Grafana {images}, the schema check uses {pinned}"


def test_dashboards_type_check_against_grafana_schema(schema_check: Path) -> None:
    # The same as `npm run check` in grafana/schema-check.
    errors = run_check(schema_check, DASHBOARDS, schema_check / "generated", None)
    assert errors == "", f"the dashboards do not match @grafana/schema:\n{errors}"


def test_a_broken_dashboard_fails_the_type_check(schema_check: Path, tmp_path: Path) -> None:
    dashboard = json.loads((DASHBOARDS / "overview.json").read_text())
    timeseries = next(p for p in visual_panels(dashboard) if p["type"] == "timeseries")
    timeseries["options"]["legend"]["displayMode"] = "lists"  # not a legend mode
    heatmap = next(p for p in visual_panels(dashboard) if p["type"] == "heatmap")
    del heatmap["options"]["yAxis"]  # required by the heatmap plugin's options
    dashboard["graphTooltip"] = "shared"  # an enum of numbers
    stat = next(p for p in visual_panels(dashboard) if p["type"] == "stat")
    stat["colour"] = "red"  # not a panel field
    del stat["targets"][0]["refId"]
    broken = tmp_path / "dashboards"
    broken.mkdir()
    (broken / "overview.json").write_text(json.dumps(dashboard))
    tsconfig = tmp_path / "tsconfig.json"
    tsconfig.write_text(json.dumps({"extends": str(schema_check / "tsconfig.json"), "include": ["generated/*.ts"]}))
    errors = run_check(schema_check, broken, tmp_path / "generated", tsconfig)
    for needle in ('"lists"', "'yAxis' is missing", "DashboardCursorSync", "'\"colour\"' does not exist",
                   "'refId' is missing"):
        assert needle in errors, f"tsc did not report {needle}:\n{errors}"
