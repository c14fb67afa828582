"""/metrics when glassbox runs as several processes (HTTP workers and an engine process under a supervisor).

prometheus_client's multiprocess mode does most of it: every process writes its counters, histograms and gauges to
memory-mapped files in one directory ($PROMETHEUS_MULTIPROC_DIR, a fresh one per server start) and any process can
read them all back, summed. The counts of processes that died stay, so a counter never goes backwards whichever
worker answers the scrape, even across an engine restart; gauges declare how processes combine (`multiprocess_mode`),
and the supervisor drops the live gauges of a dead process (`mark_process_dead`).

- A dead process's counter and histogram files are folded into one file per kind (`retire_process`), so restarts do
  not pile up files that every scrape reads: kept as the library leaves them, each restart cost ~2 ms of every later
  scrape and ~100-200 KiB of the runtime folder (1000 restarts: a 2 s scrape, 190 MiB of /tmp). The fold holds an
  exclusive lock on the folder that every scrape takes shared, so no scrape sees a dead process counted twice or
  not at all.

Where it falls short, and what is done instead:

- Exemplars: multiprocess values drop them. Each process keeps the exemplars its own observer took (histogram
  buckets, the 5xx requests counter) in an ExemplarBook, and a scrape shows the answering worker's (each one a real
  trace of that worker's requests; Prometheus scrapes often and lands on every worker in turn).
- The engine process's exemplars (engine run histogram: the kept batch spans) ride along with its scrape-time
  families (below) as `# glassbox_exemplar {json}` comment lines, which text parsers skip; the answering worker
  puts them on the engine's samples.
- Values read at scrape time by custom collectors (queue depth, GPU, torch allocator) exist only in the
  engine process. The answering worker asks the engine for them over the engine link (already in Prometheus text
  form) and appends them; while the engine process is down they are missing from the scrape, never stale.
- process_* and python_gc_* describe one process; with several they are not exported.
- Every value a process writes first asks the kernel for the process id (`os.getpid`, to notice a fork), ~22 times
  a request in a worker. The library takes the function that names the process as a documented argument
  (`MultiProcessValue(process_identifier=...)`); `use_cached_pid` hands it one that reads a pid kept up to date on
  fork instead (~0.6 µs less a value written).
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, PlatformCollector, values
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from glassbox.telemetry.metrics import new_registry
from glassbox.telemetry.processes import Roster, ServerProcesses

SeriesKey = tuple[str, frozenset[tuple[str, str]]]  # sample name, labels (le included)
EXEMPLAR_PREFIX = b"# glassbox_exemplar "
RETIRED = "retired"  # `<kind>_retired.db`: the summed values of every dead process (the collector reads the kind)
SUMMED_KINDS = ("counter", "histogram")  # kinds whose values add up across processes, dead ones included
LOCK_NAME = ".lock"  # not a *.db name: the collector's glob never reads it

_pid = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))
_cached_pid_values: Any = None  # the value class use_cached_pid installed, once per process


def use_cached_pid() -> None:
    """Make the metrics built from now on in this process write their files under a pid read from memory rather
    than from a system call; the same files, names and fork handling as the library's default. Call it before this
    process builds its first multiprocess metric: values of two value classes would write the same file apart."""
    global _cached_pid_values
    if _cached_pid_values is None:
        _cached_pid_values = values.MultiProcessValue(process_identifier=lambda: _pid[0])  # type: ignore[no-untyped-call]
    values.ValueClass = _cached_pid_values


class ExemplarBook:
    """The latest exemplar per histogram bucket series that this process took (the observer's gate decides when).
    Written from the event loop and the engine thread, read by the scrape: one lock, tiny critical sections."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[SeriesKey, Exemplar] = {}

    def record(self, name: str, labels: tuple[tuple[str, str], ...], bounds: tuple[float, ...], value: float,
               exemplar: dict[str, str]) -> None:
        """`name` is the histogram's name, `labels` its child's label pairs, `bounds` its upper bounds (+Inf last
        is implied): the exemplar belongs to the first bucket at or above `value`."""
        index = bisect.bisect_left(bounds, value)
        le = floatToGoString(bounds[index]) if index < len(bounds) else "+Inf"  # type: ignore[no-untyped-call]
        key = (name + "_bucket", frozenset((*labels, ("le", le))))
        with self._lock:
            self._latest[key] = Exemplar(exemplar, value, time.time())

    def record_sample(self, sample: str, labels: tuple[tuple[str, str], ...], value: float,
                      exemplar: dict[str, str]) -> None:
        """An exemplar for the sample `sample` (a counter's `_total`) of the child with `labels`."""
        with self._lock:
            self._latest[(sample, frozenset(labels))] = Exemplar(exemplar, value, time.time())

    def get(self, key: SeriesKey) -> Exemplar | None:
        with self._lock:
            return self._latest.get(key)

    def comment_lines(self) -> bytes:
        """Every exemplar, one `# glassbox_exemplar {json}` line each: how the engine process hands its own to the
        worker that answers a scrape (text-format parsers skip comment lines they do not know)."""
        with self._lock:
            latest = list(self._latest.items())
        return b"".join(
            EXEMPLAR_PREFIX + json.dumps({"sample": name, "labels": dict(labels), "exemplar": exemplar.labels,
                                          "value": exemplar.value, "timestamp": exemplar.timestamp},
                                         separators=(",", ":")).encode() + b"\n"
            for (name, labels), exemplar in latest)

    @classmethod
    def from_comment_lines(cls, text: bytes) -> ExemplarBook:
        """The exemplars `comment_lines` wrote, found among other lines."""
        book = cls()
        for line in text.splitlines():
            if not line.startswith(EXEMPLAR_PREFIX):
                continue
            try:
                entry = json.loads(line[len(EXEMPLAR_PREFIX):])
                key = (str(entry["sample"]), frozenset((str(k), str(v)) for k, v in entry["labels"].items()))
                book._latest[key] = Exemplar({str(k): str(v) for k, v in entry["exemplar"].items()},
                                             float(entry["value"]), entry["timestamp"])
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # an engine of another version: its exemplars are left out, never the scrape
        return book


class MultiProcessExposition:
    """A collector for one scrape: every process's files, with this process's exemplars, then the engine's
    scrape-time families (`remote`, Prometheus text, empty when the engine could not be asked)."""

    def __init__(self, path: str, book: ExemplarBook, remote: bytes = b"") -> None:
        self._path = path
        self._files = MultiProcessCollector(None, path)  # type: ignore[no-untyped-call]
        self._book = book
        self._remote = remote
        self._engine = ExemplarBook.from_comment_lines(remote) if EXEMPLAR_PREFIX in remote else None

    def collect(self) -> Iterator[Metric]:
        with _folder_lock(self._path, fcntl.LOCK_SH):  # never in the middle of a retire_process
            metrics = self._files.collect()  # type: ignore[no-untyped-call]
        for metric in metrics:
            if metric.type in ("histogram", "counter"):
                metric.samples = [self._with_exemplar(sample) for sample in metric.samples]
            yield metric
        if self._remote:
            yield from text_string_to_metric_families(self._remote.decode("utf-8"))

    def _with_exemplar(self, sample: Any) -> Any:
        if not sample.name.endswith(("_bucket", "_total")):
            return sample
        key = (sample.name, frozenset(sample.labels.items()))
        exemplar = self._book.get(key)
        if exemplar is None and self._engine is not None:
            exemplar = self._engine.get(key)
        return sample._replace(exemplar=exemplar) if exemplar is not None else sample


def retire_process(pid: int, path: str) -> None:
    """Do what a dead process `pid` leaves to the living: drop its live gauges, and add its counter and histogram
    values into the `<kind>_retired.db` files, deleting its own, so that its counts stay in every scrape while its
    files do not pile up. Call it only once the process is gone (joined): it must not write again."""
    with _folder_lock(path, fcntl.LOCK_EX):
        mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
        for kind in SUMMED_KINDS:
            dead = os.path.join(path, f"{kind}_{pid}.db")
            if not os.path.exists(dead):
                continue
            retired = os.path.join(path, f"{kind}_{RETIRED}.db")
            totals: dict[str, float] = {}
            for source in (retired, dead):
                if os.path.exists(source):
                    for key, value, _, _ in MmapedDict.read_all_values_from_file(source):  # type: ignore[no-untyped-call]
                        totals[key] = totals.get(key, 0.0) + value
            partial = os.path.join(path, f".{kind}_{RETIRED}.partial")  # not a *.db name until it is whole
            with contextlib.suppress(FileNotFoundError):
                os.remove(partial)
            written = MmapedDict(partial)  # type: ignore[no-untyped-call]
            try:
                for key, value in totals.items():
                    written.write_value(key, value, 0.0)  # type: ignore[no-untyped-call]
            finally:
                written.close()  # type: ignore[no-untyped-call]
            os.replace(partial, retired)
            os.remove(dead)


@contextlib.contextmanager
def _folder_lock(path: str, kind: int) -> Iterator[None]:
    """An flock on the metric folder's lock file: shared for reading every file, exclusive for retiring a process."""
    fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, kind)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def scrape_registry(path: str, book: ExemplarBook, remote: bytes, processes: Roster | None = None) -> CollectorRegistry:
    """One scrape's registry: every process's metric files, the engine's scrape-time families (`remote`), and, with
    `processes`, each process's process_* metrics and the interpreter's python_info."""
    registry = new_registry()
    registry.register(MultiProcessExposition(path, book, remote))
    if processes is not None:
        registry.register(ServerProcesses(processes))
        PlatformCollector(registry=registry)
    return registry


def render_text(registry: CollectorRegistry) -> bytes:
    """The engine process's scrape-time families, for a worker to append to its scrape."""
    return generate_latest(registry)
