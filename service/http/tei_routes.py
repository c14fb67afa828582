"""The rest of TEI's HTTP surface, so that "drop-in" holds: `/rerank`, `POST /` and `POST /invocations` (SageMaker),
the health probes `GET /`, `/health` and `/ping`, `GET /info`, `POST /tokenize` and `POST /decode`.

`POST /` and `/invocations` answer as `/predict` for a classifier and as `/rerank` for a reranker (a model with one
output), as TEI routes them; huggingface_hub's InferenceClient posts to the base URL. The classifying routes go
through the app's shared classify path (timed, observed, admitted like every other route); `/tokenize`, `/decode`,
`/info` and the probes do not touch the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from glassbox.service.classification import ClassifyRequest
from glassbox.service.errors import GlassboxError, NotReadyError
from glassbox.service.frontend import Frontend
from glassbox.service.http.context import error_response, request_id_of
from glassbox.service.http.encoding import decoded_body
from glassbox.service.lifecycle import Lifecycle
from glassbox.service.tokenizer import tokenize_inline
from glassbox.service.types import engine_dtype
from glassbox.service.version import version as package_version
from glassbox.service.wire import rerank, tei, tei_tools

Decode = Callable[[Request, bytes], ClassifyRequest]
# Ids /decode checks and decodes on the event loop (well under a millisecond); more go to a worker thread.
DECODE_INLINE_IDS = 4096
TEI_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "int8"}
Encode = Callable[[Any], tuple[bytes, str, dict[str, str]]]  # from the app's Classified to (body, media, headers)


class ClassifyRoutes(Protocol):
    """What these routes need from the app's handlers: the shared classify path, its frontend and lifecycle."""

    frontend: Frontend
    lifecycle: Lifecycle

    def classify(self, request: Request, route: str, decode: Decode, encode: Encode) -> Awaitable[Response]: ...


class TeiRoutes:
    def __init__(self, handlers: ClassifyRoutes) -> None:
        self._handlers = handlers
        self._frontend = handlers.frontend
        self._limit = handlers.frontend.settings.max_texts_per_request

    @property
    def reranker(self) -> bool:
        """TEI's rule: a classifier with one output is a reranker."""
        return len(self._frontend.labels) == 1

    def routes(self) -> list[Route]:
        return [
            Route("/rerank", self.rerank, methods=["POST"]),
            Route("/", self.root, methods=["POST"]),
            Route("/invocations", self.invocations, methods=["POST"]),
            Route("/", self.health, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/ping", self.health, methods=["GET"]),
            Route("/info", self.info, methods=["GET"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/decode", self.decode, methods=["POST"]),
        ]

    # --- classifying ---------------------------------------------------------------------------------------------
    async def rerank(self, request: Request, route: str = "/rerank") -> Response:
        return_text: list[bool] = []

        def decode(_r: Request, body: bytes) -> ClassifyRequest:
            parsed, wants_text = rerank.decode(body, max_texts=self._limit)  # a malformed body is a 4xx of its own
            rerank.check_reranker(self._frontend.labels)
            return_text.append(wants_text)
            return parsed

        return await self._handlers.classify(
            request, route, decode,
            lambda c: (rerank.encode(c.result, c.request, return_text[0]), "application/json", {}),
        )

    async def predict(self, request: Request, route: str) -> Response:
        return await self._handlers.classify(
            request, route,
            lambda _r, body: tei.decode(body, max_texts=self._limit),
            lambda c: (tei.encode(c.result, c.request), "application/json", {}),
        )

    async def root(self, request: Request) -> Response:
        return await (self.rerank(request, "/") if self.reranker else self.predict(request, "/"))

    async def invocations(self, request: Request) -> Response:
        route = "/invocations"
        return await (self.rerank(request, route) if self.reranker else self.predict(request, route))

    # --- around the model ----------------------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        """TEI's health answer: 200 with an empty body when the model serves (degraded included), else 503."""
        state = self._handlers.lifecycle.readiness()
        if state.ready:
            return Response(status_code=200)
        return error_response(NotReadyError(state.reason or state.phase), request_id_of(request))

    async def info(self, request: Request) -> Response:
        settings = self._frontend.settings
        config = self._frontend.config
        engine = self._frontend.engine_info()
        device = engine.device or self._handlers.lifecycle.readiness().device
        # TEI's names for what the engine computes in; before an engine process has said what it runs, what the
        # settings ask for (auto: fp32 until the engine has chosen).
        dtype = engine_dtype(engine.kind, device or "cpu")
        if not dtype:
            dtype = (settings.cuda_dtype if device.startswith("cuda") else
                     "int8" if settings.quantize == "int8" else "bf16" if settings.cpu_dtype == "bf16" else "fp32")
        dtype = TEI_DTYPES[dtype]
        version = package_version()
        body = tei_tools.info(
            model_name=self._frontend.model_name, labels=self._frontend.labels, problem=config.problem_type,
            dtype=dtype, max_input_length=self._frontend.tokenizer.max_length, version=version,
            settings={"max_concurrent_requests": settings.max_queue_requests,
                      "max_batch_tokens": settings.max_batch_tokens, "max_batch_requests": settings.max_batch_size,
                      "max_client_batch_size": settings.max_texts_per_request,
                      "auto_truncate": settings.oversize == "truncate"},
            extra={"family": config.family, "model_type": config.model_type, "architecture": config.architecture,
                   "pairs": self._frontend.tokenizer.pairs, "device": device, "engine": engine.kind},
        )
        return JSONResponse(body)

    @property
    def _most_tokens(self) -> int:
        """The most tokens /tokenize lists and /decode takes in one request: what the largest classify request can
        hand the model. Past that the answer is memory for nobody's use (see TextTokenizer.tokens)."""
        return self._limit * self._frontend.tokenizer.max_length

    async def tokenize(self, request: Request) -> Response:
        async def work(body: bytes) -> bytes:
            texts, special = tei_tools.decode_tokenize(body, max_texts=self._limit)
            tokenizer = self._frontend.tokenizer
            if tokenize_inline(texts):
                return tei_tools.encode_tokens(tokenizer.tokens(texts, special, most=self._most_tokens))
            # Listing and encoding tens of thousands of tokens takes tens of milliseconds: off the event loop too.
            return await asyncio.to_thread(
                lambda: tei_tools.encode_tokens(tokenizer.tokens(texts, special, most=self._most_tokens)))

        return await _answer(request, work, self._frontend.settings.max_body_bytes)

    async def decode(self, request: Request) -> Response:
        async def work(body: bytes) -> bytes:
            ids, skip = tei_tools.decode_ids(body, max_texts=self._limit)
            tokenizer = self._frontend.tokenizer
            if sum(map(len, ids)) <= DECODE_INLINE_IDS:
                return tei_tools.encode_texts(tokenizer.decode(ids, skip, most=self._most_tokens))
            # Checking and decoding a 4 MB body of ids held the event loop for 0.7 s: a worker thread does it.
            return await asyncio.to_thread(
                lambda: tei_tools.encode_texts(tokenizer.decode(ids, skip, most=self._most_tokens)))

        return await _answer(request, work, self._frontend.settings.max_body_bytes)


async def _answer(request: Request, work: Callable[[bytes], Awaitable[bytes]], max_body_bytes: int) -> Response:
    """Run a route that needs no engine: JSON out, glassbox's error body for a GlassboxError, X-Request-Id on both."""
    request_id = request_id_of(request)
    try:
        body = decoded_body(request.headers.get("content-encoding"), await request.body(), max_body_bytes)
        response = Response(await work(body), 200, media_type="application/json")
    except GlassboxError as error:
        response = error_response(error, request_id)
    except ClientDisconnect:
        response = Response(b"", 499)  # nobody is left to read it; the status is for the logs
    response.headers["X-Request-Id"] = request_id
    return response
