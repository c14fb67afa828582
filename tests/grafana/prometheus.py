"""Debian's `prometheus` binary as a test fixture: a temporary config that scrapes the given targets every second,
a temporary TSDB, a free port on 127.0.0.1, exemplar storage on; and a small client for its HTTP API."""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from glassbox.chaos.local import free_port

SCRAPE_INTERVAL_S = 1
RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules"
BOUND_S = 30.0  # the most any wait here may take; reached only when something is already wrong
POLL_S = 0.1


def poll(condition: Callable[[], bool], what: str, bound_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {bound_s}s waiting until {what}")
        time.sleep(POLL_S)  # a poll step of state only Prometheus knows, bounded by the deadline above


class QueryError(AssertionError):
    pass


@dataclass
class Prometheus:
    base_url: str
    client: httpx.Client
    log: Path

    def _get(self, path: str, **params: Any) -> Any:
        response = self.client.get(self.base_url + path, params=params)
        body = response.json()
        if body.get("status") != "success":
            raise QueryError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def instant(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        data = self._get("/api/v1/query", **params)
        return list(data["result"]) if data["resultType"] in ("vector", "matrix") else [data]

    def range(self, expr: str, start: float, end: float, step_s: float = SCRAPE_INTERVAL_S) -> list[dict[str, Any]]:
        data = self._get("/api/v1/query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=step_s)
        return list(data["result"])

    def exemplars(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/query_exemplars", query=expr, start=f"{start:.3f}", end=f"{end:.3f}"))

    def value(self, expr: str) -> float:
        """The single value of an instant query, NaN when it has no result."""
        result = self.instant(expr)
        return float(result[0]["value"][1]) if result else math.nan

    def wait_for_scrapes_after(self, moment: float, jobs: int) -> None:
        """Until each of `jobs` targets was last scraped more than one interval after `moment` (Unix time): a
        scrape that began before `moment` may have missed what happened just before it, the next one did not."""
        expr = f"count(timestamp(up == 1) > {moment + SCRAPE_INTERVAL_S:.3f})"
        poll(lambda: self.value(expr) >= jobs, f"Prometheus scraped all {jobs} targets after {moment:.1f}")


def config(targets: dict[str, int], rule_files: Sequence[Path] = (), alertmanager: int | None = None) -> dict[str, Any]:
    """Scrape and evaluate every second; rules from `rule_files`, alerts to Alertmanager on that port."""
    interval = f"{SCRAPE_INTERVAL_S}s"
    found: dict[str, Any] = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                           for job, port in targets.items()],
    }
    if rule_files:
        found["rule_files"] = [str(path) for path in rule_files]
    if alertmanager is not None:
        found["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager}"]}]}]}
    return found


def deploy_rules(workdir: Path) -> list[Path]:
    """deploy/prometheus/rules/*.yml as they are, except that every group is evaluated each second (the SLI group
    says 1m), written to `workdir`: for a Prometheus that runs for a minute."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = []
    for path in sorted((RULES_DIR).glob("*.yml")):
        rules = yaml.safe_load(path.read_text())
        for group in rules["groups"]:
            group["interval"] = f"{SCRAPE_INTERVAL_S}s"
        target = workdir / path.name
        target.write_text(yaml.safe_dump(rules))
        out.append(target)
    return out


@contextmanager
def started(argv: Sequence[str], log: Path, ready_url: str, what: str, *, env: dict[str, str] | None = None,
            cwd: Path | None = None, bound_s: float = BOUND_S) -> Iterator[subprocess.Popen[bytes]]:
    """A process started with its output in `log`, yielded once `ready_url` answers 200; terminated (then killed,
    past `bound_s`) on the way out. A process that exits before it is ready fails the wait with its log."""
    with log.open("wb") as out:
        process = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    try:
        def ready() -> bool:
            assert process.poll() is None, f"{what} exited:\n{log.read_text()}"
            try:
                return httpx.get(ready_url, timeout=1.0).status_code == 200
            except httpx.TransportError:
                return False

        poll(ready, f"{what} is ready", bound_s)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(bound_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(bound_s)


@contextmanager
def running_prometheus(binary: str, targets: dict[str, int], workdir: Path, *, rule_files: Sequence[Path] = (),
                       alertmanager: int | None = None) -> Iterator[Prometheus]:
    """Prometheus scraping `targets` (job -> port on 127.0.0.1), with `rule_files` and sending alerts to
    `alertmanager` when given; stopped, and its files left in `workdir`, on exit. Returns once it answers ready; the
    first scrapes are the caller's to wait for."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config(targets, rule_files, alertmanager)))
    port = free_port()
    log = workdir / "prometheus.log"
    argv = [binary, f"--config.file={config_file}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--enable-feature=exemplar-storage", "--log.level=warn"]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    client = httpx.Client(timeout=10.0)
    try:
        prometheus = Prometheus(f"http://127.0.0.1:{port}", client, log)

        def ready() -> bool:
            assert process.poll() is None, f"prometheus exited:\n{log.read_text()}"
            try:
                return client.get(prometheus.base_url + "/-/ready").status_code == 200
            except httpx.TransportError:
                return False

        poll(ready, "Prometheus is ready")
        yield prometheus
    finally:
        client.close()
        process.terminate()
        try:
            process.wait(BOUND_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(BOUND_S)
