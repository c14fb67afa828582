"""deploy/prometheus: promtool's own checks and unit tests, every alert tested both firing and silent, and every
query naming metrics and labels from the catalogue (telemetry/metrics.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from glassbox.telemetry.metrics import EVENT_LOOP_LAG_BUCKETS_S, EVENT_LOOP_LAG_SLO_S, REQUEST_BUCKETS_S, REQUEST_SLO_S
from tests.deploy.promql import catalogue, problems
from tests.deploy.tools import PROMETHEUS_DIR, ROOT, load_yaml, require_tool, run_tool

PROMTOOL_HINT = "apt-get install -y prometheus (Debian's package ships promtool)"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
TEST_FILES = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))
# (burn rate, long window, short window, severity): the Google SRE workbook's multiwindow, multi-burn-rate scheme.
BURN_SCHEME = {
    ("14.4", "1h", "5m", "page"),
    ("6", "6h", "30m", "page"),
    ("3", "1d", "2h", "ticket"),
    ("1", "3d", "6h", "ticket"),
}
SEVERITIES = {"page", "ticket", "warning"}


def rules_of_kind(kind: str) -> list[dict[str, Any]]:
    return [rule for path in RULE_FILES for group in load_yaml(path)["groups"] for rule in group["rules"]
            if kind in rule]


def alert_cases() -> dict[str, dict[str, int]]:
    """alertname -> how many evaluations in the unit tests expect it firing, and how many expect it silent."""
    cases: dict[str, dict[str, int]] = {}
    for path in TEST_FILES:
        for test in load_yaml(path)["tests"]:
            for case in test.get("alert_rule_test", []):
                counts = cases.setdefault(case["alertname"], {"firing": 0, "silent": 0})
                counts["firing" if case.get("exp_alerts") else "silent"] += 1
    return cases


def recorded_labels() -> dict[str, frozenset[str]]:
    """Recording rule name -> labels its series keep, read off the level:metric:operations name."""
    return {rule["record"]: frozenset(rule["record"].split(":")[0].split("_")) for rule in rules_of_kind("record")}


# --- promtool -------------------------------------------------------------------------------------------------------
def test_promtool_accepts_the_config_and_its_rule_files() -> None:
    promtool = require_tool("promtool", PROMTOOL_HINT)
    done = run_tool([promtool, "check", "config", str(PROMETHEUS_DIR / "prometheus.yml")])
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(RULE_FILES)} rule files found" in done.stdout


def test_promtool_accepts_the_rules() -> None:
    promtool = require_tool("promtool", PROMTOOL_HINT)
    done = run_tool([promtool, "check", "rules", *map(str, RULE_FILES)])
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_pass() -> None:
    promtool = require_tool("promtool", PROMTOOL_HINT)
    assert len(TEST_FILES) >= 4
    done = run_tool([promtool, "test", "rules", *map(str, TEST_FILES)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(TEST_FILES)


# --- coverage -------------------------------------------------------------------------------------------------------
def test_every_alert_is_tested_firing_and_silent() -> None:
    alerts = {rule["alert"] for rule in rules_of_kind("alert")}
    cases = alert_cases()
    assert len(alerts) >= 14
    assert set(cases) <= alerts, f"tests for alerts that do not exist: {set(cases) - alerts}"
    for name in sorted(alerts):
        counts = cases.get(name, {"firing": 0, "silent": 0})
        assert counts["firing"] >= 1, f"{name}: no case where it fires"
        assert counts["silent"] >= 1, f"{name}: no case where it stays silent"


def test_unit_tests_evaluate_recording_rules_before_alerts() -> None:
    groups = [group["name"] for path in RULE_FILES for group in load_yaml(path)["groups"]]
    recording = [g["name"] for path in RULE_FILES for g in load_yaml(path)["groups"]
                 if all("record" in rule for rule in g["rules"])]
    for path in TEST_FILES:
        order = load_yaml(path)["group_eval_order"]
        assert sorted(order) == sorted(groups), path.name
        assert set(order[: len(recording)]) == set(recording), f"{path.name}: recording groups must come first"


# --- meaning --------------------------------------------------------------------------------------------------------
def test_every_query_names_catalogued_metrics_and_labels() -> None:
    specs = catalogue()
    recorded = recorded_labels()
    found = []
    for rule in rules_of_kind("record") + rules_of_kind("alert"):
        found += [f"{rule.get('record') or rule.get('alert')}: {p}" for p in problems(rule["expr"], specs, recorded)]
    assert not found, "\n".join(found)


def test_recording_rule_names_say_what_they_group_by() -> None:
    for rule in rules_of_kind("record"):
        level = set(rule["record"].split(":")[0].split("_"))
        clauses = re.findall(r"\bby \(([^)]*)\)", rule["expr"])
        assert clauses, rule["record"]
        for clause in clauses:
            assert {label.strip() for label in clause.split(",")} - {"le"} == level, rule["record"]


def test_burn_rate_alerts_follow_the_multiwindow_scheme() -> None:
    budgets = {"availability": "0.001", "latency": "0.01"}
    schemes: dict[str, set[tuple[str, str, str, str]]] = {slo: set() for slo in budgets}
    for rule in rules_of_kind("alert"):
        slo = rule["labels"].get("slo")
        if slo is None:
            continue
        terms = re.findall(r"job:glassbox_(\w+):ratio_rate(\w+) > \(([\d.]+) \* ([\d.]+)\)", rule["expr"])
        assert len(terms) == 2 and re.search(r"\)\s+and\s+job:", rule["expr"]), rule["alert"]
        (sli_long, long, burn, budget), (sli_short, short, burn_short, budget_short) = terms
        assert sli_long == sli_short and burn == burn_short and budget == budget_short == budgets[slo]
        assert rule["labels"]["window"] == long and rule["alert"].endswith(long)
        schemes[slo].add((burn, long, short, rule["labels"]["severity"]))
    assert schemes == {"availability": BURN_SCHEME, "latency": BURN_SCHEME}


def test_burn_rate_alerts_need_a_minimum_of_traffic_in_their_long_window() -> None:
    """At 10 requests an hour one failure is a 10 % error ratio: without a floor on traffic it pages."""
    counted = {"availability": 'glassbox_requests_total{status=~"[1235]..|429"}',
               "latency": 'glassbox_request_duration_seconds_count{status_class="2xx"}'}
    guarded = 0
    for rule in rules_of_kind("alert"):
        slo = rule["labels"].get("slo")
        if slo is None:
            continue
        window = rule["labels"]["window"]
        guard = f"and on (job)\nsum by (job) (increase({counted[slo]}[{window}])) >= 100"
        assert guard in rule["expr"], f"{rule['alert']}: no traffic guard over its long window ({window})"
        guarded += 1
    assert guarded == 8


def test_slo_thresholds_are_bucket_boundaries() -> None:
    text = "\n".join(path.read_text() for path in RULE_FILES)
    request_le = set(re.findall(r'glassbox_request_duration_seconds_bucket\{[^}]*le="([\d.]+)"', text))
    assert request_le == {"0.25"}
    assert 0.25 in REQUEST_SLO_S and 0.25 in REQUEST_BUCKETS_S
    lag_le = set(re.findall(r'glassbox_event_loop_lag_seconds_bucket\{[^}]*le="([\d.]+)"', text))
    # The runbook calls a loop blocked at 10 ms of lag; the alert judges exactly that boundary.
    assert lag_le == {"0.01"} and 0.01 in EVENT_LOOP_LAG_BUCKETS_S and 0.01 in EVENT_LOOP_LAG_SLO_S


def test_availability_counts_5xx_and_429_out_of_everything_but_other_4xx() -> None:
    sli = [r for r in rules_of_kind("record") if r["record"].startswith("job:glassbox_availability_errors")]
    assert len(sli) == 7
    for rule in sli:
        assert 'status=~"5..|429"' in rule["expr"]
        assert rule["expr"].count('status=~"[1235]..|429"') == 2
    bad, eligible = re.compile("5..|429"), re.compile("[1235]..|429")
    for status, counted, failed in (("200", True, False), ("429", True, True), ("500", True, True),
                                    ("503", True, True), ("400", False, False), ("413", False, False),
                                    ("499", False, False)):
        assert bool(eligible.fullmatch(status)) is counted and bool(bad.fullmatch(status)) is failed, status


def test_alerts_carry_a_severity_and_a_runbook_url_that_resolves() -> None:
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    anchors = {slug(line.lstrip("#").strip()) for line in runbook.splitlines() if line.startswith("## ")}
    for rule in rules_of_kind("alert"):
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        link = rule["annotations"].get("runbook_url")
        assert link, f"{rule['alert']}: no runbook_url annotation"
        path, _, anchor = link.partition("#")
        assert (ROOT / path).is_file() and anchor in anchors, f"{rule['alert']}: {link}"
        assert "runbook" not in rule["annotations"], f"{rule['alert']}: the annotation is runbook_url"


def test_alerts_select_the_job_prometheus_scrapes() -> None:
    jobs = {job["job_name"] for job in load_yaml(PROMETHEUS_DIR / "prometheus.yml")["scrape_configs"]}
    selected = {job for rule in rules_of_kind("alert") for job in re.findall(r'job="([^"]+)"', rule["expr"])}
    assert selected == {"glassbox"} and selected <= jobs


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: Path(p).name)
def test_unit_test_files_read_the_rule_files_in_deploy(path: Path) -> None:
    rule_files = [(path.parent / name).resolve() for name in load_yaml(path)["rule_files"]]
    assert sorted(rule_files) == sorted(p.resolve() for p in RULE_FILES)
