"""The label-shift experiment end to end on the built-in model: the clients switch to one label's held-out texts,
and the server's drift figure must cross its threshold within the experiment's bound and clear afterwards, with a
real Prometheus scraping the server and evaluating deploy's alert rule on the same series.

Shortened for the test suite: phases 0.15 as long (13.5 s) at four times the rate, and the server's drift window 5 s
instead of a minute (`--drift-window-s`, its shortest), so that the window turns over within each phase as a minute
does in the full run and holds 400 answers, over the 300 the drift figure needs. The rule's `for: 1m` cannot elapse
in a 13.5 s fault phase: here the alert must be pending (its expression true) during the fault and never before it;
deploy/prometheus/tests/health_test.yml tests the minute with promtool."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from glassbox.chaos.local import free_port
from tests.chaos.test_run_experiments import EXPERIMENTS, checks, cli
from tests.grafana.dashboards import require_tool
from tests.grafana.prometheus import deploy_rules, running_prometheus

ALERT = 'ALERTS{alertname="GlassboxPredictionsDrifted", distribution="labels"}'


@pytest.mark.default_model
def test_a_shift_to_one_labels_texts_is_seen_as_drift_and_alerts_only_while_it_lasts(default_model_path: Path,
                                                                                      tmp_path: Path) -> None:
    binary = require_tool("prometheus")
    port = free_port()
    with running_prometheus(binary, {"glassbox": port}, tmp_path / "prometheus",
                            rule_files=deploy_rules(tmp_path / "rules")) as prometheus:
        code, journal, _ = cli(str(EXPERIMENTS / "label-shift.yaml"), "--model", str(default_model_path), "--out",
                               str(tmp_path / "out"), "--duration-scale", "0.15", "--rate-scale", "4",
                               "--port", str(port), "--serve-args=--drift-window-s 5")
        judged = checks(journal)
        assert code == 0, journal["reason"]
        assert judged["labels drift in the baseline"]["value"] <= 0.25
        assert judged["labels drift detected"]["value"] <= 120
        assert judged["labels drift cleared"]["value"] <= 0.25
        # The load's clock to Unix time: the run began at `start`, the first event of its timeline.
        began = datetime.fromisoformat(journal["start"].replace("Z", "+00:00")).timestamp()
        zero = began - journal["timeline"][0]["t_s"]
        phases = {p["name"]: (zero + p["start_s"], zero + p["end_s"]) for p in journal["phases"]}
        baseline, fault, recovery = phases["baseline"], phases["fault"], phases["recovery"]
        drift = prometheus.range('glassbox_prediction_drift{distribution="labels"}', baseline[0], recovery[1])
        assert drift and max(float(v) for _, v in drift[0]["values"]) > 0.25  # Prometheus saw the crossing
        alerts = prometheus.range(ALERT, baseline[0], recovery[1])
        times = [float(t) for series in alerts for t, _ in series["values"]]
        assert times, "the alert's expression never held"
        assert min(times) >= fault[0], "the alert was pending before the shift"
        assert min(times) <= fault[1]
        assert max(times) < recovery[1] - 2, "the alert still held at the end of the recovery"
