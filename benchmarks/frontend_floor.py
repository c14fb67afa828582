"""The front end's floor: what the libraries glassbox serves with cost per request, with none of glassbox's own work.

    .venv/bin/python -m benchmarks.frontend_floor --port PORT [--tokenizer PATH]

One ASGI route, `POST /v1/classify`, on the same stack `glassbox serve` runs (uvicorn with uvloop and httptools,
Starlette routing, msgspec): it reads the body, decodes the JSON, tokenizes the text when `--tokenizer` names a
tokenizer.json (truncated as the server does, no padding), and answers a fixed result with the token count (`GET
/readyz` says it is up). No batcher, no engine, no telemetry, no protocol guard, no error handling beyond what
Starlette does. `benchmarks.frontend --floor`
runs it beside the null-engine server, so that the difference between the two is glassbox's own cost per request.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from tokenizers import Tokenizer


class Answer(msgspec.Struct):
    results: list[dict[str, Any]]
    tokens: int  # how many tokens the text had (0 without a tokenizer), so a test can see the work was done


RESULTS = [{"label": "fresh", "score": 0.5}]


def floor_app(tokenizer_path: str | None = None, max_length: int = 256) -> Starlette:
    tokenizer: Tokenizer | None = None
    if tokenizer_path is not None:
        tokenizer = Tokenizer.from_file(tokenizer_path)
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length)
    decode = msgspec.json.Decoder(dict[str, Any]).decode
    encode = msgspec.json.Encoder().encode

    async def classify(request: Request) -> Response:
        document = decode(await request.body())
        tokens = 0 if tokenizer is None else len(tokenizer.encode(document["text"], add_special_tokens=True).ids)
        return Response(encode(Answer(RESULTS, tokens)), media_type="application/json")

    async def ready(_request: Request) -> Response:
        return Response(b"ready")

    return Starlette(routes=[Route("/v1/classify", classify, methods=["POST"]),
                             Route("/readyz", ready, methods=["GET"])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokenizer", default=None, help="tokenizer.json to encode each text with")
    args = parser.parse_args(argv)
    uvicorn.run(floor_app(args.tokenizer), host="127.0.0.1", port=args.port, loop="uvloop", http="httptools",
                ws="none", lifespan="off", access_log=False, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
