"""Everything a running server holds, built once from Settings: model, tokenizer, engine, batcher; and the Frontend,
the part of it the HTTP side needs wherever the engine runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from service.batching import Batcher, BatcherLimits, SubmitResult
from service.engines.base import Engine, configure_torch
from service.engines.degradation import DegradationListener
from service.engines.factory import DeviceChoice, build_engine, choose_device, with_cpu_fallback
from service.engines.fallback import FallbackEngine
from service.engines.null import NullEngine
from service.errors import ModelLoadError
from service.model.config import read_config
from service.model.default import default_model_dir
from service.model.loader import CONFIG_FILE, TOKENIZER_FILE, LoadedModel, check_tokenizer, load_model
from service.observer import NullObserver, Observer, SpanRef
from service.settings import Settings
from service.tokenizer import TextTokenizer
from service.types import TokenBatch


class Submitter(Protocol):
    """Where a request's rows go to be run: the in-process Batcher, or the link to the engine process."""

    async def submit(self, tokens: TokenBatch, deadline_ns: int, *, request_id: str = "",
                     span: SpanRef | None = None) -> SubmitResult: ...


@dataclass(frozen=True, slots=True)
class Frontend:
    """What the HTTP side needs: settings, the tokenizer, the labels and name of the model, and where to submit."""

    settings: Settings
    tokenizer: TextTokenizer
    labels: tuple[str, ...]
    model_name: str
    batcher: Submitter  # the in-process Batcher, or the link to the engine process (same submit)


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
        return Frontend(self.settings, self.tokenizer, self.labels, self.model_name, self.batcher)

    def watch_degradation(self, listener: DegradationListener) -> None:
        """Tell `listener` (the app's Lifecycle) when the engine falls back and recovers; a no-op without one."""
        if isinstance(self.engine, FallbackEngine):
            self.engine.attach(listener)


def model_path(settings: Settings) -> Path:
    return Path(settings.model).expanduser() if settings.model else default_model_dir()


def build_frontend(settings: Settings, batcher: Submitter) -> Frontend:
    """The HTTP side alone, for a worker process: config and tokenizer are read, the weights are not (the engine
    process loads them). Raises the same GlassboxErrors as build_runtime for a bad directory."""
    path = model_path(settings)
    if not path.is_dir():
        raise ModelLoadError(f"model directory {path} does not exist")
    config = read_config(path / CONFIG_FILE)
    if config.num_labels == 0:
        raise ModelLoadError(f"{path / CONFIG_FILE} has no id2label: glassbox serves classifiers and needs the labels")
    tokenizer_file = path / TOKENIZER_FILE
    if not tokenizer_file.is_file():
        raise ModelLoadError(f"{tokenizer_file} is missing: a model directory needs {TOKENIZER_FILE}")
    check_tokenizer(tokenizer_file, config)
    tokenizer = TextTokenizer.from_file(tokenizer_file, settings.max_length, config.max_position_embeddings)
    return Frontend(settings, tokenizer, config.id2label, settings.model_name or path.name, batcher)


def build_runtime(settings: Settings, *, engine: Engine | None = None, observer: Observer | None = None,
                  wrap_primary: Callable[[Engine], Engine] | None = None) -> Runtime:
    """Load and check everything that can be wrong before a socket is opened. Raises GlassboxError subclasses with
    one clear message (a bad model directory, an unavailable device). Warm-up happens later, in the lifespan.

    `wrap_primary` (the composition root passes the chaos engine wrapper) wraps the primary engine before the CPU
    fallback goes around it, so what it injects takes the real fallback path; with it, a CPU primary gets a CPU
    fallback too. An injected `engine` is wrapped as it is, without a fallback."""
    configure_torch(settings.threads, settings.seed)
    loaded = load_model(model_path(settings))
    tokenizer = TextTokenizer.from_file(
        loaded.tokenizer_file, settings.max_length, loaded.config.max_position_embeddings
    )
    observer = observer or NullObserver()
    if engine is None and settings.engine == "null":
        engine = NullEngine(loaded.config.num_labels)
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
    return Runtime(
        settings=settings,
        model=loaded,
        tokenizer=tokenizer,
        engine=engine,
        batcher=batcher,
        device_choice=choice,
        model_name=settings.model_name or loaded.name,
    )
