"""Just enough PromQL reading to check that queries in deploy files name metrics and labels glassbox exports.

It finds selectors (`name{label="..."}`) and grouping clauses (`by (...)`, `on (...)`); it is not a parser, and
promtool (where it runs) checks the syntax itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from glassbox.telemetry.metrics import MetricSpec, build_metrics

# Labels Prometheus adds to every scraped series: from the scrape config, and from the Prometheus Operator's
# ServiceMonitor discovery on Kubernetes.
TARGET_LABELS = frozenset({"job", "instance", "namespace", "service", "pod", "endpoint", "container"})
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTOR = re.compile(r"(?<![\w:])([a-zA-Z_][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
# PromQL words that look like metric names in the selector pattern.
_KEYWORDS = frozenset({
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values", "by",
    "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset", "rate",
    "irate", "increase", "delta", "idelta", "deriv", "histogram_quantile", "abs", "clamp_min", "clamp_max",
    "round", "scalar", "vector", "time", "absent", "label_replace", "avg_over_time", "max_over_time",
    "min_over_time", "sum_over_time", "changes", "resets", "e", "inf", "nan",
})


@dataclass(frozen=True, slots=True)
class Reference:
    metric: str
    labels: tuple[str, ...]  # label names its matchers use


def catalogue() -> dict[str, MetricSpec]:
    return {spec.name: spec for spec in build_metrics(CollectorRegistry()).catalogue}


def references(expr: str) -> list[Reference]:
    """Every series selector in `expr` (quoted strings blanked first, so label values are never taken for names)."""
    blanked = _STRING.sub('""', expr)
    blanked = re.sub(r"\[[^\]]*\]", "", blanked)  # range and subquery durations
    blanked = _GROUPING.sub("", blanked)  # label lists of by (...), on (...)
    found = []
    for match in _SELECTOR.finditer(blanked):
        name, matchers = match.group(1), match.group(2) or ""
        following = blanked[match.end():].lstrip()[:1]
        if name in _KEYWORDS or following == "(" or name.isdigit():
            continue
        found.append(Reference(name, tuple(_MATCHER.findall(matchers))))
    return found


def grouping_labels(expr: str) -> set[str]:
    labels: set[str] = set()
    for group in _GROUPING.findall(_STRING.sub('""', expr)):
        labels |= {label.strip() for label in group.split(",") if label.strip()}
    return labels


def client_library_series() -> dict[str, frozenset[str]]:
    """The series the client library's process, GC and platform collectors export beside glassbox's own (the
    `process_*` and `python_*` rows of docs/metrics.md), with their labels; with `--workers N` the scrape labels each
    process's series with `process`."""
    registry = CollectorRegistry()
    build_metrics(registry)
    return {sample.name: frozenset(sample.labels) | {"process"}
            for family in registry.collect() if not family.name.startswith("glassbox_") for sample in family.samples}


def exported_labels(name: str, specs: dict[str, MetricSpec]) -> frozenset[str] | None:
    """The labels a scraped series called `name` can carry, or None when glassbox exports no such series."""
    if name == "up":
        return TARGET_LABELS
    client = client_library_series().get(name)
    if client is not None:
        return TARGET_LABELS | client
    if name in specs and specs[name].kind != "histogram":
        return TARGET_LABELS | set(specs[name].labels)
    for suffix in HISTOGRAM_SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and base in specs and specs[base].kind == "histogram":
            extra = {"le"} if suffix == "_bucket" else set()
            return TARGET_LABELS | set(specs[base].labels) | extra
    return None


def problems(expr: str, specs: dict[str, MetricSpec], recorded: dict[str, frozenset[str]]) -> list[str]:
    """What in `expr` names a series or label that does not exist. `recorded` maps recording-rule names to the
    labels their series keep."""
    out: list[str] = []
    usable: set[str] = set()
    refs = references(expr)
    if not refs:
        out.append(f"no series selector found in {expr!r}")
    for ref in refs:
        labels = recorded.get(ref.metric) if ":" in ref.metric else exported_labels(ref.metric, specs)
        if labels is None:
            out.append(f"{ref.metric}: not exported by glassbox nor recorded by a rule")
            continue
        usable |= labels
        out += [f"{ref.metric} has no label {label}" for label in ref.labels if label not in labels]
    out += [f"grouping by {label}, which none of its series has" for label in grouping_labels(expr) - usable]
    return out
