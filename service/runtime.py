"""Everything a running server holds, built once from Settings: model, tokenizer, engine, batcher (the Frontend, the
part of it the HTTP side needs wherever the engine runs, is service/frontend.py's)."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from glassbox.service.batching import Batcher, BatcherLimits
from glassbox.service.batching.formation import FormationPolicy
from glassbox.service.cores import available_cores, intra_op_threads, serial_main_kept
from glassbox.service.engines.base import Engine, configure_torch, engine_threads
from glassbox.service.engines.degradation import DegradationListener, degradable
from glassbox.service.engines.factory import (
    DeviceChoice,
    build_engine,
    choose_cpu_precision,
    choose_device,
    with_cpu_fallback,
)
from glassbox.service.engines.null import NullEngine
from glassbox.service.frontend import EngineInfo, Frontend, model_path
from glassbox.service.model.loader import LoadedModel, load_model
from glassbox.service.observer import NullObserver, Observer
from glassbox.service.settings import Settings
from glassbox.service.tokenizer import TextTokenizer


@dataclass(frozen=True, slots=True)
class Runtime:
    settings: Settings
    model: LoadedModel
    tokenizer: TextTokenizer
    engine: Engine
    batcher: Batcher
    device_choice: DeviceChoice
    model_name: str

    @property
    def labels(self) -> tuple[str, ...]:
        return self.model.labels

    @property
    def frontend(self) -> Frontend:
        return Frontend(self.settings, self.model.config, self.tokenizer, self.model_name, self.batcher,
                        lambda: EngineInfo(self.engine.device, self.engine.kind))

    def watch_degradation(self, listener: DegradationListener) -> None:
        """Tell `listener` (the app's Lifecycle) when the engine falls back and recovers; a no-op without one."""
        engine = degradable(self.engine)
        if engine is not None:
            engine.attach(listener)


class IntraOpTeams:
    """The intra-op threads of each engine thread, sized so that no OpenMP team slows another (service/cores.py: the
    threads libgomp manages, one for the main thread plus every team's workers, must not outnumber the CPUs, or they
    all stop spinning between parallel regions).

    The first engine thread may use all `threads` (the batcher gives a batch that starts alone to it); the others
    share what is left of the CPUs, at least one each, and never more than `threads`. Before each batch an engine
    thread takes its share of `threads` among the batches running, within its own limit. Measured on 2 cores
    (docs/benchmarks/2026-12-04-openmp-teams.md): a lone batch-1 request 1-1.7 ms faster
    (fp32) than with a team of two on every engine thread."""

    def __init__(self, threads: int, runners: int, cores: int, lower: Callable[[], None] | None = None) -> None:
        self.threads = max(1, threads)
        spare = max(0, cores - self.threads)
        self.limits = tuple(self.threads if i == 0 else max(1, min(self.threads, 1 + spare // (runners - 1)))
                            for i in range(runners))
        self._lower = lower
        self._local = threading.local()

    def started(self, index: int) -> None:
        """On engine thread `index` as it starts."""
        limit = self.limits[index] if index < len(self.limits) else 1
        self._local.limit = limit
        # torch sizes a thread's team from a process-wide value the first time the thread asks; asked first, the
        # count set next is the one that holds.
        torch.get_num_threads()
        torch.set_num_threads(limit)
        if self._lower is not None:
            self._lower()

    def share(self, running: int) -> None:
        """On an engine thread before each batch, with `running` batches in the engine (this one included): its share
        of the intra-op threads (all of them for a batch that runs alone). The setting is the calling thread's own
        (OpenMP's thread count is per thread); a thread that was never `started` is limited by `threads` alone."""
        limit = getattr(self._local, "limit", self.threads)
        wanted = max(1, min(limit, self.threads // max(running, 1)))
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)


def lower_thread_priority(steps: int) -> Callable[[], None] | None:
    """On an engine thread as it starts: raise its own nice value by `steps` (Linux keeps one per thread), so that
    when cores are short the scheduler runs the HTTP event loop first; None when there is nothing to do.

    Measured on a 2-core host under 3x overload (docs/benchmarks/2026-12-02-engine-nice-5.md): the 429 P99 at
    the client fell from 21-30 to 12-15 ms and the event loop's tokenize P99 from 4.4 to 1.0 ms, at the same
    admitted throughput. A failure (a sandbox that forbids it) leaves the priority as it was and is logged by
    each engine thread."""
    if steps <= 0 or not sys.platform.startswith("linux"):
        return None

    def lower() -> None:
        tid = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps))
        except OSError as exc:
            logging.getLogger("glassbox.batcher").warning("could not lower the engine thread's priority: %s", exc)

    return lower


def build_runtime(settings: Settings, *, engine: Engine | None = None, observer: Observer | None = None,
                  wrap_primary: Callable[[Engine], Engine] | None = None) -> Runtime:
    """Load and check everything that can be wrong before a socket is opened. Raises GlassboxError subclasses with
    one clear message (a bad model directory, an unavailable device). Warm-up happens later, in the lifespan.

    `wrap_primary` (the composition root passes the chaos engine wrapper) wraps the primary engine before the CPU
    fallback goes around it, so what it injects takes the real fallback path; with it, a CPU primary gets a CPU
    fallback too. An injected `engine` is wrapped as it is, without a fallback."""
    # A process that kept its main thread serial (service/cores.py) leaves it so: the engine threads size their own.
    configure_torch(0 if serial_main_kept() else settings.threads, settings.seed)
    loaded = load_model(model_path(settings))
    if not loaded.config.labels_named:
        logging.getLogger("glassbox").warning(
            "%s has no id2label: serving its %d outputs as %s, transformers' default names (name them in config.json)",
            loaded.path / "config.json", loaded.config.num_labels, ", ".join(loaded.labels[:4])
            + (", ..." if loaded.config.num_labels > 4 else ""))
    tokenizer = loaded.text_tokenizer(settings.max_length)
    observer = observer or NullObserver()
    if engine is None and settings.engine == "null":
        engine = NullEngine(loaded.config.num_labels)
    if engine is None:
        choice = choose_device(settings.device)
        # One choice of the CPU's number format for the CPU engine and for a GPU's CPU fallback alike.
        precision = None
        if choice.device == "cpu" or settings.cpu_fallback:
            precision = choose_cpu_precision(loaded, settings, tokenizer.max_length)
        engine = build_engine(loaded, settings, choice.device, tokenizer.max_length, precision)
        if wrap_primary is not None:
            engine = wrap_primary(engine)
        engine = with_cpu_fallback(engine, loaded, settings, observer, on_cpu=wrap_primary is not None,
                                   precision=precision)
    else:
        choice = DeviceChoice(engine.device, "an engine was injected by the caller")
        if wrap_primary is not None:
            engine = wrap_primary(engine)
    cores = available_cores()
    runners = engine_threads(settings.engine_threads, engine, cores)
    threads = intra_op_threads(settings.threads, torch.get_num_threads)
    teams = IntraOpTeams(threads, runners, cores, lower_thread_priority(settings.engine_nice))
    batcher = Batcher(
        engine, BatcherLimits.from_settings(settings, tokenizer.max_length), observer, pad_id=tokenizer.pad_id,
        formation=None if settings.batch_hold else FormationPolicy(hold_share=0.0), runners=runners,
        share_threads=teams.share if runners > 1 else None,
        on_thread_start=teams.started,
    )
    return Runtime(
        settings=settings,
        model=loaded,
        tokenizer=tokenizer,
        engine=engine,
        batcher=batcher,
        device_choice=choice,
        model_name=settings.model_name or loaded.name,
    )
