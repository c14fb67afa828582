"""The batcher in front of the real eager engine on a tiny random model: mixing rows of different requests
and lengths into one padded batch must give each text the logits it gets when run alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from glassbox.service.batching import Batcher, BatcherLimits
from glassbox.service.engines.eager import EagerEngine
from glassbox.service.model.loader import load_model
from glassbox.service.tokenizer import TextTokenizer

TEXTS = [
    "good", "the movie was very good and the acting was great", "bad plot", "awful",
    "the best film with the worst ending and a long boring story about love and hate", "fun",
    "slow sad music", "a short scene",
]


def test_batched_logits_match_each_text_run_alone(tiny_model_dir: Path) -> None:
    loaded = load_model(tiny_model_dir)
    tokenizer = TextTokenizer.from_file(loaded.tokenizer_file, 64, loaded.config.max_position_embeddings)
    engine = EagerEngine(loaded.model, "cpu")
    alone = np.concatenate([engine.run(tokenizer.encode([text])).logits for text in TEXTS])  # [8, labels]
    limits = BatcherLimits(max_batch_size=4, max_batch_tokens=1024, max_queue_requests=16,
                           max_queue_tokens=10_000, length_buckets=(4, 8, 16, 64))
    batcher = Batcher(engine, limits, pad_id=tokenizer.pad_id)

    async def scenario() -> list[np.ndarray]:
        requests = [tokenizer.encode(TEXTS[:3]), tokenizer.encode(TEXTS[3:4]), tokenizer.encode(TEXTS[4:])]
        results = await asyncio.gather(*(batcher.submit(r, 10**19) for r in requests))
        return [r.logits for r in results]

    batcher.start()
    try:
        logits = np.concatenate(asyncio.run(asyncio.wait_for(scenario(), 60)))
    finally:
        batcher.stop()
    assert batcher.stats().batches_run >= 2  # split and mixed, not one text per batch only
    np.testing.assert_allclose(logits, alone, rtol=1e-4, atol=1e-5)
