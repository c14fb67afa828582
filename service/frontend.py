"""The HTTP side of a server, wherever its engine runs: the model's config, tokenizer and name, where requests are
submitted, and what the engine is. An HTTP worker process of the multi-process layout builds only this, so it never
imports torch (service/runtime.py builds the engine on top, in the process that runs it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from glassbox.service.batching.records import SubmitResult
from glassbox.service.model.config import ModelConfig
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.files import describe_model
from glassbox.service.observer import SpanRef
from glassbox.service.settings import Settings
from glassbox.service.tokenizer import TextTokenizer
from glassbox.service.types import ProblemType, TokenBatch


class Submitter(Protocol):
    """Where a request's rows go to be run: the in-process Batcher, or the link to the engine process."""

    async def submit(self, tokens: TokenBatch, deadline_ns: int, *, request_id: str = "",
                     span: SpanRef | None = None) -> SubmitResult: ...

    def check_admission(self, deadline_ns: int) -> None:
        """Raise the refusal any request would get now (before decoding and tokenizing it), or return."""


@dataclass(frozen=True, slots=True)
class EngineInfo:
    device: str  # where batches run now ("" while no engine process is connected)
    kind: str  # "eager-fp32", "fallback(graphs-fp16, eager-fp32)", ...


@dataclass(frozen=True, slots=True)
class Frontend:
    """What the HTTP side needs: settings, the model's config, tokenizer and name, where to submit, and what the
    engine is (for /info), wherever the engine runs."""

    settings: Settings
    config: ModelConfig
    tokenizer: TextTokenizer
    model_name: str
    batcher: Submitter  # the in-process Batcher, or the link to the engine process (same submit)
    engine_info: Callable[[], EngineInfo]

    @property
    def labels(self) -> tuple[str, ...]:
        return self.config.id2label

    @property
    def problem_type(self) -> ProblemType:
        return self.config.problem_type


def model_path(settings: Settings) -> Path:
    return Path(settings.model).expanduser() if settings.model else default_model_dir()


def build_frontend(settings: Settings, batcher: Submitter,
                   engine_info: Callable[[], EngineInfo] = lambda: EngineInfo("", "")) -> Frontend:
    """The HTTP side alone, for a worker process: config and tokenizer are read and checked, the weights are not
    (the engine process loads them). Raises the same GlassboxErrors as build_runtime for a bad directory."""
    files = describe_model(model_path(settings))
    return Frontend(settings, files.config, files.text_tokenizer(settings.max_length),
                    settings.model_name or files.path.name, batcher, engine_info)
