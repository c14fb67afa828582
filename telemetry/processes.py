"""The `process_*` metrics of every process of a multi-process server, in one scrape.

prometheus_client's ProcessCollector describes the process it runs in, so with `--workers N` the HTTP worker that
answers a scrape could only speak for itself (and its siblings' scrapes would jump from one worker to another). Here
the worker reads /proc for each process on the server's roster (the supervisor, the engine, every worker), through
ProcessCollector itself, and labels each series with the process's role. The GC collector has no counterpart: its
counts cannot be read from outside a process. python_info, the same interpreter for all, comes once from the answering
worker (telemetry/multiproc.py, scrape_registry)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping

from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

Roster = Callable[[], Mapping[str, int]]


class ServerProcesses(Collector):
    """process_* for each (role, pid) of `roster`, labelled `process="<role>"`; a process gone between the roster
    and the read is left out."""

    def __init__(self, roster: Roster) -> None:
        self._roster = roster

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for role, pid in sorted(self._roster().items()):
            for family in ProcessCollector(pid=functools.partial(int, pid), registry=None).collect():
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation, family.type)
                for sample in family.samples:
                    into.add_sample(sample.name, {**sample.labels, "process": role}, sample.value)
        return list(merged.values())
