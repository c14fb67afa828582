"""The classify pipeline shared by every route: parse -> tokenize -> queue/infer -> postprocess.

Each stage is timed with perf_counter_ns into a per-request StageClock; nothing here knows about HTTP,
Prometheus or OpenTelemetry. Routes differ only in how they decode the body and encode the result.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypedDict

from glassbox.service.batching import SubmitResult
from glassbox.service.classification import ClassifyRequest, ClassifyResult
from glassbox.service.errors import EmptyInputError, TextTooLongError
from glassbox.service.frontend import Frontend
from glassbox.service.observer import SpanRef, StageSpan
from glassbox.service.tokenizer import tokenize_inline
from glassbox.service.types import TokenBatch


class StageClock:
    """Per-request stage timings. Created for each request; never shared."""

    def __init__(self, start_ns: int | None = None) -> None:
        self.spans: list[StageSpan] = []
        # Starting at the request's own start time leaves no instant before the first stage uncounted.
        self._mark = time.perf_counter_ns() if start_ns is None else start_ns

    def lap(self, name: str) -> None:
        now = time.perf_counter_ns()
        self.spans.append(StageSpan(name, self._mark, now))
        self._mark = now

    def add(self, name: str, start_ns: int, end_ns: int) -> None:
        self.spans.append(StageSpan(name, start_ns, end_ns))
        self._mark = end_ns

    @property
    def mark_ns(self) -> int:
        """Where the next stage starts: the end of the last one."""
        return self._mark

    def restart(self) -> None:
        self._mark = time.perf_counter_ns()


@dataclass(frozen=True, slots=True)
class Classified:
    request: ClassifyRequest
    result: ClassifyResult
    tokens: TokenBatch
    submit: SubmitResult


class WorkDone(TypedDict, total=False):
    """The fields of a RequestRecord that say what work a classified request did; none when nothing was classified
    (the record's defaults then say so)."""

    texts: int
    tokens: int
    max_tokens: int
    truncated: int
    device: str
    engine_mode: str
    batch_ids: tuple[int, ...]
    batch_spans: tuple[SpanRef, ...]
    attributes: dict[str, str]


def work_done(classified: Classified | None, record_text: bool) -> WorkDone:
    if classified is None:
        return {}
    tokens, submit = classified.tokens, classified.submit
    work: WorkDone = {
        "texts": tokens.size, "tokens": tokens.real_tokens, "max_tokens": tokens.max_length,
        "truncated": int(tokens.truncated.sum()), "device": submit.device, "engine_mode": submit.engine_mode,
        "batch_ids": submit.batch_ids, "batch_spans": submit.batch_spans,
    }
    if record_text:  # raw text leaves the request path only when the operator opted in (--record-text)
        work["attributes"] = {"text": "\n".join(classified.request.texts)}
    return work


class ClassifyPipeline:
    def __init__(self, frontend: Frontend) -> None:
        self._frontend = frontend
        self._reject_oversize = frontend.settings.oversize == "reject"

    async def __call__(
        self,
        request: ClassifyRequest,
        clock: StageClock,
        deadline_ns: int,
        request_id: str,
        guard: Callable[[Awaitable[SubmitResult]], Awaitable[SubmitResult]],
        span: SpanRef | None = None,
    ) -> Classified:
        """`request` was parsed by the caller (clock already has its parse lap). `guard` wraps the wait for the
        engine so that a client disconnect cancels it (and the batcher drops the items before they run). `span` is
        the request's server span, named at its start, for the batches it rides in to link to."""
        # As TEI: an empty text has nothing to classify ([CLS] [SEP] would get an answer), nor an empty second text.
        if "" in request.texts:
            raise EmptyInputError(empty_text_message(request.texts.index(""), len(request.texts)))
        if request.pairs is not None and "" in request.pairs:
            raise EmptyInputError(empty_text_message(request.pairs.index(""), len(request.texts), "second "))
        tokenizer = self._frontend.tokenizer
        if tokenize_inline(request.texts, request.pairs):
            tokens = tokenizer.encode(request.texts, request.pairs)
        else:  # many or long texts would hold the event loop: a worker thread tokenizes them without the GIL
            tokens = await asyncio.to_thread(tokenizer.encode, request.texts, request.pairs)
        # Lapped before the length check, so a request refused for an over-long text still shows what tokenizing
        # it cost.
        clock.lap("tokenize")
        reject = self._reject_oversize if request.truncate is None else not request.truncate
        if reject and bool(tokens.truncated.any()):
            first = int(tokens.truncated.argmax())
            raise TextTooLongError(
                f"text {first} is longer than the {tokenizer.max_length}-token limit (--max-length) and truncation is "
                "off"
            )
        submitted = await guard(self._frontend.batcher.submit(tokens, deadline_ns, request_id=request_id, span=span))
        # The queue stage starts where tokenize ended, not at the batcher's own submit time: the submit task first
        # runs a loop iteration later, and that wait must belong to some stage for the stages to add up.
        clock.add("queue", clock.mark_ns, submitted.queue_end_ns)
        # Infer runs on from the end of the queue stage: the batcher's assembly of the padded batch, between the
        # batch being formed and the engine starting, is part of running it.
        clock.add("infer", clock.mark_ns, submitted.infer_end_ns)
        result = ClassifyResult.from_logits(self._frontend.labels, submitted.logits, tokens.truncated, tokens.lengths,
                                            self._frontend.problem_type)
        return Classified(request=request, result=result, tokens=tokens, submit=submitted)


def empty_text_message(index: int, count: int, which: str = "") -> str:
    where = f"the {which}text" if count == 1 else f"the {which}text of input {index}" if which else f"text {index}"
    return f"{where} is empty: there is nothing to classify (send at least one character)"

