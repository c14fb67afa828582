"""Reading glassbox's Grafana dashboards the way Grafana does: panels (rows flattened), their Prometheus queries,
the annotation and variable queries, and template variables substituted into PromQL that Prometheus can run."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
PROVISIONING = GRAFANA / "provisioning"
SCHEMA_CHECK = GRAFANA / "schema-check"

# The dashboards docs/runbook.md sends the reader to, by exact title.
TITLES = {
    "slo.json": "glassbox / SLO",
    "overview.json": "glassbox / Overview",
    "stages.json": "glassbox / Stages",
    "batching.json": "glassbox / Batching",
    "device.json": "glassbox / Device",
    "process.json": "glassbox / Process",
    "degradation.json": "glassbox / Degradation & chaos",
    "model.json": "glassbox / Model",
}

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?P<metric>.+?)\s*,\s*(?P<label>\w+)\s*\)\s*$")
_METRIC = re.compile(r"\b((?:glassbox|process|python)_[a-z0-9_]+)\b")


def require_tool(name: str) -> str:
    """The tool's path. Missing: a failure under `make test` (GLASSBOX_REQUIRE_TOOLS=1), else a skip that says so."""
    path = shutil.which(name)
    if path is None:
        message = f"`{name}` is not installed (see the Makefile's system-deps target)"
        if os.environ.get("GLASSBOX_REQUIRE_TOOLS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@dataclass(frozen=True)
class Query:
    """One PromQL expression a dashboard sends: a panel target, an annotation or a variable's label_values."""

    dashboard: str  # title
    source: str  # "panel", "annotation" or "variable"
    title: str  # the panel, annotation or variable it belongs to
    ref: str  # the target's refId ("" for variables)
    expr: str  # as written in the JSON, template variables unexpanded
    instant: bool
    exemplar: bool
    repeat: str  # the variable a repeated panel repeats over, else ""

    @property
    def where(self) -> str:
        return f"{self.dashboard} › {self.source} {self.title!r}" + (f" › {self.ref}" if self.ref else "")


def load_dashboards() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, with the panels a (collapsed) row holds."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def visual_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    return (panel for panel in panels(dashboard) if panel["type"] != "row")


def variables(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return list(dashboard.get("templating", {}).get("list", []))


def queries(dashboard: dict[str, Any]) -> list[Query]:
    title = dashboard["title"]
    found = []
    for panel in visual_panels(dashboard):
        for target in panel.get("targets", []):
            found.append(Query(title, "panel", panel["title"], target.get("refId", ""), target.get("expr", ""),
                               bool(target.get("instant")) and not target.get("range"),
                               bool(target.get("exemplar")), panel.get("repeat", "")))
    for annotation in dashboard.get("annotations", {}).get("list", []):
        target = annotation.get("target") or {}
        if annotation.get("datasource", {}).get("type") == "prometheus":
            found.append(Query(title, "annotation", annotation["name"], target.get("refId", ""),
                               target.get("expr", ""), False, False, ""))
    for variable in variables(dashboard):
        if variable["type"] == "query":
            found.append(Query(title, "variable", variable["name"], "", label_values_promql(variable["query"]),
                               True, False, ""))
    return found


def label_values_promql(query: Any) -> str:
    """Grafana's `label_values(metric, label)` variable query as the PromQL that has the same answer."""
    text = query if isinstance(query, str) else query.get("query", "")
    match = _LABEL_VALUES.match(text)
    if match is None:
        raise AssertionError(f"unsupported variable query {text!r}: use label_values(metric, label)")
    return f"group by ({match['label']}) ({match['metric']})"


def variable_values(variable: dict[str, Any]) -> list[str]:
    """The values a custom variable offers."""
    return [value.strip() for value in str(variable.get("query", "")).split(",") if value.strip()]


def all_value(variable: dict[str, Any]) -> str:
    """What Grafana substitutes when "All" is selected: the allValue, else a regex of every value. For a query
    variable without an allValue that is every value its query found; with every variable on "All", as here, those
    are all the series there are, so `.*` selects the same."""
    if variable.get("allValue"):
        return str(variable["allValue"])
    if variable["type"] == "query":
        return ".*"
    return "(" + "|".join(re.escape(value) for value in variable_values(variable)) + ")"


def expansions(query: Query, dashboard: dict[str, Any], builtins: dict[str, str]) -> list[str]:
    """The query with every variable substituted: "All" for dashboard variables, and for a repeated panel one
    expansion per value of the variable it repeats over (as Grafana renders one panel per value). A variable the
    dashboard does not define fails here instead of reaching Prometheus as a syntax error."""
    defined = {variable["name"]: variable for variable in variables(dashboard)}
    fixed = {name: all_value(variable) for name, variable in defined.items()} | builtins
    choices = [{}] if not query.repeat else [{query.repeat: value} for value in variable_values(defined[query.repeat])]

    def substitute(values: dict[str, str]) -> str:
        def one(match: re.Match[str]) -> str:
            name = next(group for group in match.groups() if group)
            if name in values:
                return values[name]
            if name in fixed:
                return fixed[name]
            raise AssertionError(f"{query.where}: unknown template variable ${name} in {query.expr!r}")

        return _VARIABLE.sub(one, query.expr)

    return [substitute(choice) for choice in choices]


def metric_names(expr: str) -> set[str]:
    return set(_METRIC.findall(expr))


def provisioned_datasources() -> dict[str, dict[str, Any]]:
    """uid -> data source, from every provisioning file."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((PROVISIONING / "datasources").glob("*.y*ml")):
        for source in yaml.safe_load(path.read_text()).get("datasources", []):
            found[source["uid"]] = source
    return found
