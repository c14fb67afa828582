"""Classify a table with Spark: `mapInPandas` hands each Python worker its partitions as pandas DataFrames.

    python docs/examples/spark.py reviews.jsonl scored/ --model ~/.cache/glassbox/models/minilm-rt-sentiment

`classify_pandas(model_dir)` returns the function Spark calls per partition; it builds one Classifier per Python
worker process on first use (Spark reuses its Python workers) and adds `label`, `score` and `truncated` to each
DataFrame. The model directory must be readable on every executor (a shared path, or shipped with --files / an
image). pandas and pyarrow must be installed where the workers run.
"""

from __future__ import annotations

import argparse
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.types import BooleanType, DoubleType, StringType, StructField, StructType

from glassbox.service.bulk import classify_pandas

RESULT_FIELDS = [StructField("label", StringType()), StructField("score", DoubleType()),
                 StructField("truncated", BooleanType())]


def classify_frame(frame: Any, model_dir: str, *, threads_per_worker: int = 1) -> Any:
    """A Spark DataFrame with a `text` column -> the same rows with the result columns."""
    schema = StructType([*frame.schema.fields, *RESULT_FIELDS])
    score = classify_pandas(model_dir, device="cpu", threads=threads_per_worker, engine_threads=1)
    return frame.mapInPandas(score, schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", help="JSON lines with a 'text' field")
    parser.add_argument("output", help="directory for the scored JSON lines")
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    spark = SparkSession.builder.appName("glassbox-classify").getOrCreate()
    classify_frame(spark.read.json(args.input), args.model).write.json(args.output)


if __name__ == "__main__":
    main()
