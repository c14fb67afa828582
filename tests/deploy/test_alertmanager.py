"""deploy/alertmanager: amtool's checks and routing tree, then the real path an alert takes.

End to end, with Debian's binaries: `glassbox serve` (tiny model, CPU, chaos control API on) is scraped every second
by Prometheus loaded with deploy/prometheus/rules/*.yml, which sends its alerts to Alertmanager running
deploy/alertmanager/alertmanager.yml. The only changes to the files are the ones a one-minute test needs: rule groups
evaluated each second (tests/grafana/prometheus.py:deploy_rules), Alertmanager's group waits of one second, and every
webhook pointed at a receiver inside this test. A chaos `error` fault makes every batch fail, so classify requests
are answered 500; the availability burn alert must reach the `page` receiver and the per-replica warning the
`warning` one, each payload naming its runbook section.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml

from glassbox.chaos.local import free_port
from tests.deploy.tools import DEPLOY, PROMETHEUS_DIR, ROOT, load_yaml, require_tool, run_tool
from tests.grafana.prometheus import Prometheus, deploy_rules, running_prometheus, started

ALERTMANAGER_DIR = DEPLOY / "alertmanager"
CONFIG = ALERTMANAGER_DIR / "alertmanager.yml"
HINT = "apt-get install -y prometheus-alertmanager (Debian's package ships amtool)"
BOUND_S = 60.0  # the most any wait here may take; reached only when something is already wrong
CHAOS_TOKEN = "alertmanager-test-token"
FAILING_REQUESTS = 150  # over the burn alerts' floor of 100 requests in the long window


def alertmanager_binary() -> str:
    """Debian names the server prometheus-alertmanager; upstream's tarball names it alertmanager."""
    return shutil.which("alertmanager") or require_tool("prometheus-alertmanager", HINT)


def routes(labels: dict[str, str]) -> list[str]:
    amtool = require_tool("amtool", HINT)
    done = run_tool([amtool, "config", "routes", "test", f"--config.file={CONFIG}",
                     *(f"{k}={v}" for k, v in labels.items())])
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.split()


def alert_rules() -> list[dict[str, Any]]:
    return [rule for path in sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
            for group in load_yaml(path)["groups"] for rule in group["rules"] if "alert" in rule]


# --- amtool -------------------------------------------------------------------------------------------------------
def test_amtool_accepts_the_config() -> None:
    amtool = require_tool("amtool", HINT)
    done = run_tool([amtool, "check-config", str(CONFIG)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and "3 receivers" in done.stdout


def test_every_severity_of_every_alert_routes_to_its_own_receiver() -> None:
    severities = {rule["labels"]["severity"] for rule in alert_rules()}
    assert severities == {"page", "ticket", "warning"}
    for severity in sorted(severities):
        assert routes({"alertname": "Any", "job": "glassbox", "severity": severity}) == [severity]
    # An alert without a severity (a rule added without one) still reaches someone.
    assert routes({"alertname": "Any", "job": "glassbox"}) == ["warning"]


def suppressed(port: int, alerts: list[dict[str, str]]) -> dict[str, bool]:
    """Post `alerts` (their labels) to a running Alertmanager; whether each one is now inhibited, by alertname and
    instance."""
    url = f"http://127.0.0.1:{port}/api/v2/alerts"
    assert httpx.post(url, json=[{"labels": labels} for labels in alerts], timeout=10).status_code == 200
    deadline = time.monotonic() + BOUND_S
    while True:
        listed = httpx.get(url, timeout=10).json()
        if len(listed) == len(alerts) or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # until Alertmanager lists every alert posted
    return {f"{a['labels']['alertname']}/{a['labels'].get('instance', '')}": a["status"]["state"] == "suppressed"
            for a in listed}


def test_a_down_target_silences_its_own_warnings_and_a_missing_job_silences_all(tmp_path: Path) -> None:
    config = config_for_test(free_port())
    job = {"job": "glassbox"}
    down = {"alertname": "GlassboxTargetDown", "severity": "page", "instance": "10.0.0.1:8000", **job}
    same = {"alertname": "GlassboxInstanceErrors", "severity": "warning", "instance": "10.0.0.1:8000", **job}
    other = {"alertname": "GlassboxFallbackActive", "severity": "warning", "instance": "10.0.0.2:8000", **job}
    ticket = {"alertname": "GlassboxLatencyBurn1d", "severity": "ticket", "slo": "latency", **job}
    with running_alertmanager(config, tmp_path / "one-down") as port:
        # One replica down says nothing about another replica, nor about the job's SLO.
        assert suppressed(port, [down, same, other, ticket]) == {
            "GlassboxTargetDown/10.0.0.1:8000": False, "GlassboxInstanceErrors/10.0.0.1:8000": True,
            "GlassboxFallbackActive/10.0.0.2:8000": False, "GlassboxLatencyBurn1d/": False}
    with running_alertmanager(config, tmp_path / "all-gone") as port:
        missing = {"alertname": "GlassboxTargetMissing", "severity": "page", **job}
        assert suppressed(port, [missing, other, ticket]) == {
            "GlassboxTargetMissing/": False, "GlassboxFallbackActive/10.0.0.2:8000": True,
            "GlassboxLatencyBurn1d/": True}


# --- end to end ---------------------------------------------------------------------------------------------------
class Webhook:
    """An HTTP server on 127.0.0.1 that keeps each POSTed Alertmanager payload with the path it came to."""

    def __init__(self) -> None:
        self.received: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.seen: list[tuple[str, dict[str, Any]]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                received.put((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Webhook:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, receiver: str, alertname: str) -> dict[str, Any]:
        """The first firing alert named `alertname` that reached `receiver` (sent to its path, and named so in the
        payload), whenever it came; a failure says what did arrive."""
        deadline = time.monotonic() + BOUND_S
        while True:
            for path, payload in self.seen:
                for alert in payload["alerts"]:
                    if (path == f"/{receiver}" and payload["receiver"] == receiver
                            and alert["labels"]["alertname"] == alertname and alert["status"] == "firing"):
                        return dict(alert)
            try:
                self.seen.append(self.received.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                arrived = [(path, a["labels"]["alertname"]) for path, payload in self.seen for a in payload["alerts"]]
                raise AssertionError(f"no {alertname} at /{receiver} within {BOUND_S}s; arrived: {arrived}") from None


def config_for_test(webhook_port: int) -> dict[str, Any]:
    """deploy's config with every webhook sent to the test's receiver and one-second group waits."""
    config: dict[str, Any] = load_yaml(CONFIG)
    for receiver in config["receivers"]:
        for hook in receiver["webhook_configs"]:
            hook["url"] = f"http://127.0.0.1:{webhook_port}/{receiver['name']}"
    for route in [config["route"], *config["route"].get("routes", [])]:
        route["group_wait"] = route["group_interval"] = "1s"
    return config


@contextmanager
def running_alertmanager(config: dict[str, Any], workdir: Path) -> Iterator[int]:
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "alertmanager.yml"
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    log = workdir / "alertmanager.log"
    argv = [alertmanager_binary(), f"--config.file={config_file}", f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"]
    with started(argv, log, f"http://127.0.0.1:{port}/-/ready", "Alertmanager", bound_s=BOUND_S):
        yield port


@contextmanager
def served_with_chaos(model_dir: Path, log: Path) -> Iterator[int]:
    port = free_port()
    argv = [sys.executable, "-m", "glassbox.service", "serve", "--model", str(model_dir), "--model-name", "tiny",
            "--device", "cpu", "--port", str(port), "--threads", "1", "--max-length", "32",
            "--length-buckets", "16,32", "--batch-buckets", "1,4", "--chaos", "--drain-timeout-s", "5",
            "--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLASSBOX_")} | {"GLASSBOX_CHAOS_TOKEN": CHAOS_TOKEN}
    with started(argv, log, f"http://127.0.0.1:{port}/readyz", "glassbox serve", env=env, cwd=ROOT, bound_s=BOUND_S):
        yield port


def diagnosis(prometheus: Prometheus) -> str:
    """What Prometheus made of it, for a failure message: rule health, alerts, the SLI and the guard."""
    rules = prometheus.client.get(prometheus.base_url + "/api/v1/rules").json()["data"]["groups"]
    broken = [(r["name"], r.get("lastError")) for g in rules for r in g["rules"] if r.get("health") != "ok"]
    exprs = ["ALERTS", "job:glassbox_availability_errors:ratio_rate5m", "job:glassbox_availability_errors:ratio_rate1h",
             'sum by (job) (increase(glassbox_requests_total{status=~"[1235]..|429"}[1h]))']
    found = {expr: prometheus.instant(expr) for expr in exprs}
    return f"rules not ok: {broken}\n" + "\n".join(f"{k}: {v}" for k, v in found.items())


def runbook_anchors() -> set[str]:
    text = (ROOT / "docs" / "runbook.md").read_text()
    return {re.sub(r"[^\w\- ]", "", line[3:].strip().lower()).replace(" ", "-")
            for line in text.splitlines() if line.startswith("## ")}


def test_a_chaos_fault_pages_through_alertmanager_with_the_runbook(tiny_model_dir: Path,
                                                                   tmp_path: Path) -> None:
    prometheus_binary = require_tool("prometheus", "apt-get install -y prometheus")
    with Webhook() as webhook, \
            running_alertmanager(config_for_test(webhook.port), tmp_path / "alertmanager") as am_port, \
            served_with_chaos(tiny_model_dir, tmp_path / "serve.log") as port, \
            running_prometheus(prometheus_binary, {"glassbox": port}, tmp_path / "prometheus",
                               rule_files=deploy_rules(tmp_path / "rules"), alertmanager=am_port) as prometheus:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=30.0) as client:
            # Healthy first: the counters' series exist before the failures start, so rates count all of them.
            for _ in range(10):
                assert client.post("/v1/classify", json={"text": "a fine film"}).status_code == 200
            prometheus.wait_for_scrapes_after(time.time(), 1)
            armed = client.post("/chaos/faults", json={"fault": "error", "ttl_s": 300, "fraction": 1.0},
                                headers={"authorization": f"Bearer {CHAOS_TOKEN}"})
            assert armed.status_code in (200, 201), armed.text
            # The 500 series is born with the first failure, and Prometheus counts increases from a series' first
            # sample: one failure, a scrape, then the rest over several scrapes (a burst inside one scrape interval
            # would read as a single jump of a new series, i.e. no increase at all).
            statuses = []
            for chunk in (1, *[FAILING_REQUESTS // 5] * 5):
                statuses += [client.post("/v1/classify", json={"text": "a fine film"}).status_code
                             for _ in range(chunk)]
                prometheus.wait_for_scrapes_after(time.time(), 1)
            assert statuses.count(500) == len(statuses) == FAILING_REQUESTS + 1, statuses

        try:
            page = webhook.wait_for("page", "GlassboxAvailabilityBurn1h")
        except AssertionError as error:
            raise AssertionError(f"{error}\n{diagnosis(prometheus)}") from None
        assert page["labels"] | {"job": "glassbox", "severity": "page", "slo": "availability"} == page["labels"]
        warning = webhook.wait_for("warning", "GlassboxInstanceErrors")
        assert warning["labels"]["instance"] == f"127.0.0.1:{port}"
        for alert in (page, warning):
            path, _, anchor = alert["annotations"]["runbook_url"].partition("#")
            assert path == "docs/runbook.md" and anchor == "availability-5xx-and-429"
            assert anchor in runbook_anchors()
        # Prometheus itself holds the alert as firing (the webhook saw what Prometheus decided, not a replay).
        firing = prometheus.instant('ALERTS{alertname="GlassboxAvailabilityBurn1h", alertstate="firing"}')
        assert firing, "Prometheus does not hold the alert as firing"
