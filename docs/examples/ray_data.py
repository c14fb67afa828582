"""Classify a JSON lines file with Ray Data: one glassbox model per actor, batches of rows in, rows with results out.

    python docs/examples/ray_data.py reviews.jsonl scored/ --model ~/.cache/glassbox/models/minilm-rt-sentiment

Each actor loads the model once (`Classifier.__init__`) and then scores every batch Ray hands it: `map_batches` passes
a dict of numpy arrays (Ray's default batch format) and gets the same dict back with `label`, `score` and
`truncated` added. On a cluster, `ray.init(address="auto")` and more actors; nothing else changes.
"""

from __future__ import annotations

import argparse
from typing import Any

import ray

from glassbox.service.bulk import Classifier


def classify_dataset(dataset: Any, model_dir: str, *, actors: int = 2, batch_size: int = 512,
                     threads_per_actor: int = 1) -> Any:
    """A Ray Dataset with a `text` column -> the same rows with the result columns."""
    return dataset.map_batches(
        Classifier,
        fn_constructor_kwargs={"model_dir": model_dir, "device": "cpu", "threads": threads_per_actor,
                               "engine_threads": 1},
        batch_size=batch_size,  # rows per call: the Classifier length-sorts them into engine batches itself
        compute=ray.data.ActorPoolStrategy(size=actors),  # actors, each with its own model
        num_cpus=threads_per_actor,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", help="JSON lines with a 'text' field")
    parser.add_argument("output", help="directory for the scored JSON lines")
    parser.add_argument("--model", required=True)
    parser.add_argument("--actors", type=int, default=2)
    args = parser.parse_args()
    ray.init()
    classify_dataset(ray.data.read_json(args.input), args.model, actors=args.actors).write_json(args.output)


if __name__ == "__main__":
    main()
