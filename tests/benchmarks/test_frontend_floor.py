"""benchmarks.frontend_floor, the library stack without glassbox's own work, answers as the benchmark expects and
really tokenizes when given a tokenizer (else the floor it reports would be too low)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette

from benchmarks.frontend_floor import floor_app
from glassbox.service.tokenizer import TextTokenizer


def post(app: Starlette, text: str) -> dict[str, Any]:
    async def scenario() -> dict[str, Any]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://floor") as client:
            assert (await client.get("/readyz")).status_code == 200
            answer = await client.post("/v1/classify", json={"text": text})
            assert answer.status_code == 200
            body: dict[str, Any] = answer.json()
            return body

    return asyncio.run(asyncio.wait_for(scenario(), 10))


def test_the_floor_tokenizes_as_the_server_does(tiny_model_dir: Path) -> None:
    text = "a wonderful, quietly devastating film"
    path = tiny_model_dir / "tokenizer.json"
    body = post(floor_app(str(path), max_length=16), text)
    expected = TextTokenizer.from_file(path, max_length=16, model_max_length=512).encode([text])
    assert body["tokens"] == int(expected.lengths[0]) > 2
    assert body["results"][0]["label"] == "fresh"


def test_without_a_tokenizer_nothing_is_tokenized() -> None:
    assert post(floor_app(), "a wonderful film")["tokens"] == 0
