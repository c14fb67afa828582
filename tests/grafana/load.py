"""Bounded traffic for the dashboard proof: good requests on every route, each with a sampled W3C traceparent (so
the histograms get exemplars), and the bad ones each error and reject series needs: invalid JSON, too many texts,
an expired deadline, oversized headers and bodies, truncated texts, and bursts past a small queue bound (429)."""

from __future__ import annotations

import asyncio
import json as jsonlib
import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

SENTENCE = "the movie was good and the plot was fun but the ending was slow and a bit sad"
WORDS = SENTENCE.split(" ")
TEXTS = [" ".join(WORDS[: 3 + i % len(WORDS)]) for i in range(16)]
LONG_TEXT = " ".join(WORDS * 20)  # ~340 tokens: cut to --max-length
BURST = 64  # concurrent requests per burst, against a queue bound of a few requests
MAX_BURSTS = 20  # 429s under a burst are near certain; give up (and fail the test) only after this many


@dataclass
class Traffic:
    statuses: Counter[int] = field(default_factory=Counter)
    trace_ids: set[str] = field(default_factory=set)  # sampled trace ids sent in traceparent headers
    transport_errors: int = 0  # connections the guard closed before a response could be read


async def send(client: httpx.AsyncClient, traffic: Traffic, method: str, path: str, *, traced: bool = True,
               json: Any = None, content: bytes | None = None, headers: dict[str, str] | None = None) -> int:
    headers = dict(headers or {})
    if traced:
        trace_id = secrets.token_hex(16)
        headers["traceparent"] = f"00-{trace_id}-{secrets.token_hex(8)}-01"
        traffic.trace_ids.add(trace_id)
    try:
        response = await client.request(method, path, headers=headers, json=json, content=content)
    except httpx.TransportError:
        traffic.transport_errors += 1
        return 0
    traffic.statuses[response.status_code] += 1
    return response.status_code


async def good_requests(client: httpx.AsyncClient, traffic: Traffic, model_name: str, count: int,
                        concurrency: int) -> None:
    async def one(i: int) -> None:
        texts = TEXTS[i % len(TEXTS): i % len(TEXTS) + 1 + i % 4]
        if i % 5 == 0:
            await send(client, traffic, "POST", "/predict", json={"inputs": texts[0]})
        elif i % 7 == 0:
            body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
            await send(client, traffic, "POST", f"/v2/models/{model_name}/infer", json=body)
        else:
            await send(client, traffic, "POST", "/v1/classify", json={"texts": texts})

    gate = asyncio.Semaphore(concurrency)

    async def gated(i: int) -> None:
        async with gate:
            await one(i)

    await asyncio.gather(*(gated(i) for i in range(count)))


async def bad_requests(client: httpx.AsyncClient, traffic: Traffic, max_texts: int, max_body_bytes: int) -> None:
    json_headers = {"content-type": "application/json"}
    for _ in range(3):
        await send(client, traffic, "POST", "/v1/classify", content=b'{"texts": [', headers=json_headers)
        await send(client, traffic, "POST", "/v1/classify", json={"texts": TEXTS[:1] * (max_texts + 1)})
        await send(client, traffic, "POST", "/v1/classify", json={"text": LONG_TEXT})
        # An expired deadline: dropped before it is queued, answered 504.
        await send(client, traffic, "POST", "/v1/classify", json={"text": TEXTS[0]},
                   headers={"x-request-timeout-ms": "0.001"})
        # The protocol guard closes these before the app sees them.
        await send(client, traffic, "POST", "/v1/classify", json={"text": TEXTS[0]}, traced=False,
                   headers={"x-padding": "p" * 20_000})
        await send(client, traffic, "POST", "/v1/classify", traced=False, headers=json_headers,
                   content=jsonlib.dumps({"text": "a" * (max_body_bytes + 1)}).encode())


async def bursts_until_rejected(client: httpx.AsyncClient, traffic: Traffic) -> None:
    """Bursts of concurrent multi-text requests until the bounded queue has answered 429 (again)."""
    before = traffic.statuses[429]
    body = {"texts": TEXTS[:8]}
    for _ in range(MAX_BURSTS):
        await asyncio.gather(*(send(client, traffic, "POST", "/v1/classify", json=body) for _ in range(BURST)))
        if traffic.statuses[429] > before:
            return


async def drive(traffic: Traffic, base_url: str, model_name: str, *, requests: int, concurrency: int,
                max_texts: int, max_body_bytes: int) -> None:
    """One round of everything: good requests, bad ones, then bursts until a 429; outcomes go into `traffic`."""
    limits = httpx.Limits(max_connections=BURST, max_keepalive_connections=BURST)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30.0) as client:
        await good_requests(client, traffic, model_name, requests, concurrency)
        await bad_requests(client, traffic, max_texts, max_body_bytes)
        await bursts_until_rejected(client, traffic)


async def classify_some(base_url: str, count: int) -> Counter[int]:
    """A few plain requests, sequentially (for the degraded target: each one is a batch the engine routes)."""
    statuses: Counter[int] = Counter()
    async with httpx.AsyncClient(base_url=base_url, timeout=30.0) as client:
        for i in range(count):
            response = await client.post("/v1/classify", json={"texts": TEXTS[i % 4: i % 4 + 2]})
            statuses[response.status_code] += 1
    return statuses
