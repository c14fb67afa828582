"""Everything a running server holds, built once from Settings: model, tokenizer, engine, batcher."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from service.batcher import Batcher, BatcherLimits
from service.batching.capacity import CapacityPolicy
from service.engines.base import Engine, configure_torch
from service.engines.degradation import DegradationListener
from service.engines.factory import DeviceChoice, build_engine, choose_device, with_cpu_fallback
from service.engines.fallback import FallbackEngine
from service.model.default import default_model_dir
from service.model.loader import LoadedModel, load_model
from service.observer import NullObserver, Observer
from service.settings import Settings
from service.tokenizer import TextTokenizer


@dataclass(frozen=True, slots=True)
class Runtime:
    settings: Settings
    model: LoadedModel
    tokenizer: TextTokenizer
    engine: Engine
    batcher: Batcher
    device_choice: DeviceChoice
    model_name: str
    capacity: CapacityPolicy | None = None  # set when the engine can fall back: queue bounds follow the device

    @property
    def labels(self) -> tuple[str, ...]:
        return self.model.labels

    def watch_degradation(self, listener: DegradationListener) -> None:
        """Tell `listener` (the app's Lifecycle) when the engine falls back and recovers; a no-op without one."""
        if isinstance(self.engine, FallbackEngine):
            self.engine.attach(listener)


def model_path(settings: Settings) -> Path:
    return Path(settings.model).expanduser() if settings.model else default_model_dir()


def build_runtime(settings: Settings, *, engine: Engine | None = None, observer: Observer | None = None,
                  wrap_primary: Callable[[Engine], Engine] | None = None) -> Runtime:
    """Load and check everything that can be wrong before a socket is opened. Raises GlassboxError subclasses with
    one clear message (a bad model directory, an unavailable device). Warm-up happens later, in the lifespan.

    `wrap_primary` (the composition root passes the chaos engine wrapper) wraps the primary engine before the CPU
    fallback goes around it, so what it injects takes the real fallback path; with it, a CPU primary gets a CPU
    fallback too. An injected `engine` is wrapped as it is, without a fallback."""
    configure_torch(settings.threads, settings.seed)
    loaded = load_model(model_path(settings))
    tokenizer = loaded.text_tokenizer(settings.max_length)
    observer = observer or NullObserver()
    if engine is None:
        choice = choose_device(settings.device)
        engine = build_engine(loaded, settings, choice.device, tokenizer.max_length)
        if wrap_primary is not None:
            engine = wrap_primary(engine)
        engine = with_cpu_fallback(engine, loaded, settings, observer, on_cpu=wrap_primary is not None)
    else:
        choice = DeviceChoice(engine.device, "an engine was injected by the caller")
        if wrap_primary is not None:
            engine = wrap_primary(engine)
    batcher = Batcher(
        engine, BatcherLimits.from_settings(settings, tokenizer.max_length), observer, pad_id=tokenizer.pad_id,
    )
    capacity = None
    if isinstance(engine, FallbackEngine):
        capacity = CapacityPolicy(batcher, deadline_s=settings.request_timeout_ms / 1000)
        engine.attach(capacity)
    return Runtime(
        settings=settings,
        model=loaded,
        tokenizer=tokenizer,
        engine=engine,
        batcher=batcher,
        device_choice=choice,
        model_name=settings.model_name or loaded.name,
        capacity=capacity,
    )
