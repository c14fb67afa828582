"""`Classifier`: a model on one device that scores many texts at once, length-sorted, at the engine's full speed.

The same object runs `glassbox classify` and drops into other engines' batch APIs, one model per worker:

- Ray Data: `ds.map_batches(Classifier, fn_constructor_kwargs={"model_dir": ...}, concurrency=N, batch_size=...)`;
  a batch is a dict of numpy arrays (Ray's default), a pandas DataFrame or a pyarrow Table, and comes back as the
  same type with `label`, `score` and `truncated` columns added.
- Spark: `df.mapInPandas(classify_pandas(model_dir), schema)`.
- Plain Python: `Classifier(path).predict(["a text", ...])` -> a list of dicts.

pandas and pyarrow are never imported here: a batch of theirs is recognised by its type's module, and answered
with its own type's methods.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from glassbox.service.bulk.plan import cut_batches
from glassbox.service.classification import ClassifyResult
from glassbox.service.cores import available_cores
from glassbox.service.engines.base import Engine, configure_torch
from glassbox.service.engines.base import engine_threads as choose_engine_threads
from glassbox.service.engines.factory import build_engine, choose_device
from glassbox.service.errors import InvalidRequestError
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.loader import load_model
from glassbox.service.observer import BatchRecord, NullObserver, Observer, RequestRecord, StageSpan
from glassbox.service.runtime import IntraOpTeams
from glassbox.service.settings import load_settings
from glassbox.service.tokenizer import Pairs
from glassbox.service.types import EngineTiming, FloatArray, TokenBatch

ROUTE = "bulk"  # the route label bulk runs report their stage metrics under


@dataclass(slots=True)
class BulkStats:
    """Running totals of one Classifier: what the final summary of `glassbox classify` reports."""

    texts: int = 0
    tokens: int = 0  # real tokens, special tokens included
    truncated: int = 0
    batches: int = 0
    padded_tokens: int = 0  # tokens the engine computed (each batch padded to its longest text)
    tokenize_s: float = 0.0
    infer_s: float = 0.0  # wall time of the engine stage (batches side by side count once)
    devices: set[str] = field(default_factory=set)

    @property
    def padding_ratio(self) -> float:
        return 1.0 - self.tokens / self.padded_tokens if self.padded_tokens else 0.0


class Classifier:
    """A loaded, warmed model with its tokenizer. `classify` scores a list of texts; `__call__` a table batch.

    Not thread-safe: one per worker (Ray actor, Spark Python worker, CLI run). With `engine_threads` > 1 (the default
    on a CPU with two or more cores) batches run side by side, sharing the intra-op threads, as the server does."""

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        device: Literal["auto", "cpu", "cuda"] = "cpu",
        quantize: Literal["none", "int8"] = "none",
        cpu_dtype: Literal["auto", "fp32", "bf16"] = "auto",
        max_length: int = 256,
        max_batch_size: int = 64,
        batch_tokens: int = 8192,
        threads: int = 0,
        engine_threads: int = 1,
        text_column: str = "text",
        pair_column: str | None = None,
        all_scores: bool = False,
        observer: Observer | None = None,
    ) -> None:
        if max_batch_size < 1 or batch_tokens < 1:
            raise InvalidRequestError("max_batch_size and batch_tokens must be at least 1")
        settings = load_settings({"device": device, "quantize": quantize, "cpu_dtype": cpu_dtype, "threads": threads,
                                  "max_length": max_length, "max_batch_size": max_batch_size,
                                  "engine_threads": engine_threads})
        configure_torch(settings.threads, settings.seed)
        self.model_dir = Path(model_dir).expanduser() if model_dir else default_model_dir()
        self.model = load_model(self.model_dir)
        self.tokenizer = self.model.text_tokenizer(settings.max_length)
        self.engine: Engine = build_engine(self.model, settings, choose_device(device).device,
                                           self.tokenizer.max_length)
        self.engine.warmup()
        self.labels = self.model.labels
        self.problem = self.model.config.problem_type
        self.max_batch_size = max_batch_size
        self.batch_tokens = batch_tokens
        self.text_column = text_column
        self.pair_column = pair_column
        self.all_scores = all_scores
        self.observer: Observer = observer or NullObserver()
        self.stats = BulkStats()
        self.engine_threads = choose_engine_threads(settings.engine_threads, self.engine, available_cores())
        self._pool = ThreadPoolExecutor(self.engine_threads, "glassbox-bulk") if self.engine_threads > 1 else None
        self._share = IntraOpTeams(settings.threads or torch.get_num_threads(), self.engine_threads,
                                   available_cores()).share
        self._batch_ids = itertools.count(1)
        self._calls = itertools.count(1)

    # --- texts in, scores out ---------------------------------------------------------------------------------------

    def tokenize(self, texts: Sequence[str], pairs: Pairs | None = None) -> TokenBatch:
        start = time.perf_counter()
        tokens = self.tokenizer.encode(texts, pairs) if texts else _empty_batch()
        self.stats.tokenize_s += time.perf_counter() - start
        return tokens

    def run(self, tokens: TokenBatch, *, tokenize_ns: tuple[int, int] | None = None) -> ClassifyResult:
        """Score tokenized texts: length-sorted batches under the token budget, rows answered in input order.
        `tokenize_ns` (start, end) puts the caller's tokenize stage into the record the observer gets."""
        start = time.perf_counter_ns()
        logits = np.zeros((tokens.size, len(self.labels)), dtype=np.float32)  # [n, labels]
        batches = cut_batches(tokens.lengths, self.max_batch_size, self.batch_tokens) if tokens.size else []
        request_id = f"bulk-{next(self._calls)}"
        modes: set[str] = set()
        for rows, (batch_logits, timing) in zip(batches, self._each(tokens, batches), strict=True):
            logits[rows] = batch_logits
            modes.add(timing.mode)
            self._count(timing, request_id)
        infer_end = time.perf_counter_ns()
        result = ClassifyResult.from_logits(self.labels, logits, tokens.truncated, tokens.lengths, self.problem)
        end = time.perf_counter_ns()
        stats = self.stats
        stats.texts += tokens.size
        stats.tokens += tokens.real_tokens
        stats.truncated += int(tokens.truncated.sum())
        stats.infer_s += (infer_end - start) / 1e9
        stages: tuple[StageSpan, ...] = (StageSpan("infer", start, infer_end), StageSpan("postprocess", infer_end, end))
        if tokenize_ns is not None:
            stages = (StageSpan("tokenize", *tokenize_ns), *stages)
        self.observer.on_request(RequestRecord(
            request_id=request_id, route=ROUTE, method="RUN", status=200, error_code=None,
            start_ns=stages[0].start_ns, end_ns=end, stages=stages, texts=tokens.size, tokens=tokens.real_tokens,
            max_tokens=tokens.max_length, truncated=int(tokens.truncated.sum()), device=self.engine.device,
            engine_mode=modes.pop() if len(modes) == 1 else ("mixed" if modes else ""),
            wall_start_ns=time.time_ns(),
        ))
        return result

    def classify(self, texts: Sequence[str], pairs: Pairs | None = None) -> ClassifyResult:
        """Raises InvalidRequestError for what is not a list of texts (and of second texts, or None, one per text). A
        bare string is a sequence of strings too, and was scored one character at a time."""
        if isinstance(texts, str | bytes):
            raise InvalidRequestError(f"texts must be a list of texts, not one {type(texts).__name__}: pass [text]")
        texts = [_text(t, i, "texts") for i, t in enumerate(texts)]
        if pairs is not None:
            if isinstance(pairs, str | bytes):
                raise InvalidRequestError("pairs must be a list of second texts (or None), one per text, not one "
                                          f"{type(pairs).__name__}")
            if len(pairs) != len(texts):
                raise InvalidRequestError(f"{len(texts)} texts but {len(pairs)} pairs: one (or None) a text")
            pairs = [None if p is None else _text(p, i, "pairs") for i, p in enumerate(pairs)]
        start = time.perf_counter_ns()
        tokens = self.tokenize(texts, pairs)
        return self.run(tokens, tokenize_ns=(start, time.perf_counter_ns()))

    def predict(self, texts: Sequence[str], pairs: Pairs | None = None) -> list[dict[str, Any]]:
        """One dict per text: `label` (not for a regression head), `score`, `truncated`, and with `all_scores` a
        `scores` dict of every label's score."""
        columns = self.columns(self.classify(texts, pairs))
        names = list(columns)
        return [dict(zip(names, values, strict=True)) for values in zip(*(columns[n] for n in names), strict=True)]

    def columns(self, result: ClassifyResult) -> dict[str, list[Any]]:
        """The result as columns of plain Python values: label, score, truncated (and scores, with all_scores)."""
        probs = result.probs  # [n, L]
        out: dict[str, list[Any]] = {}
        if result.problem == "regression":
            out["score"] = probs[:, 0].tolist()
        else:
            best = probs.argmax(axis=1) if result.size else np.zeros(0, dtype=np.int64)  # [n]
            out["label"] = [self.labels[i] for i in best.tolist()]
            out["score"] = probs[np.arange(result.size), best].tolist()
        out["truncated"] = result.truncated.tolist()
        if self.all_scores and result.problem != "regression":
            out["scores"] = [dict(zip(self.labels, row, strict=True)) for row in probs.tolist()]
        return out

    # --- table batches (Ray Data, Spark, pandas, pyarrow) -----------------------------------------------------------

    def __call__(self, batch: Any) -> Any:
        """A batch of rows with a text column -> the same kind of batch with the result columns added.

        dict of arrays or lists (Ray Data's numpy format), pandas DataFrame, pyarrow Table or RecordBatch; a plain
        list of strings gives `predict`'s list of dicts."""
        if isinstance(batch, list | tuple):
            return self.predict([_text(t, i, "input") for i, t in enumerate(batch)])
        kind = type(batch).__module__.split(".")[0]
        if kind == "pyarrow":
            texts, pairs = self._texts(batch.column(self.text_column).to_pylist(), self._pair_list(batch, kind))
            return _arrow_with(batch, self._flat(self.classify(texts, pairs)))
        if kind == "pandas":
            texts, pairs = self._texts(batch[self.text_column].tolist(), self._pair_list(batch, kind))
            return batch.assign(**self._flat(self.classify(texts, pairs)))
        if isinstance(batch, Mapping):
            texts, pairs = self._texts(list(batch[self.text_column]), self._pair_list(batch, kind))
            flat = self._flat(self.classify(texts, pairs))
            return {**batch, **{name: np.asarray(values) for name, values in flat.items()}}
        raise InvalidRequestError(f"cannot classify a {type(batch).__name__}: pass a list of texts, a dict of columns, "
                                  "a pandas DataFrame or a pyarrow Table")

    def _pair_list(self, batch: Any, kind: str) -> list[Any] | None:
        if self.pair_column is None:
            return None
        column = batch.column(self.pair_column).to_pylist() if kind == "pyarrow" else batch[self.pair_column]
        return list(column)

    def _texts(self, values: list[Any], pairs: list[Any] | None) -> tuple[list[str], list[str | None] | None]:
        texts = [_text(v, i, self.text_column) for i, v in enumerate(values)]
        if pairs is None:
            return texts, None
        return texts, [None if _missing(p) else _text(p, i, self.pair_column or "") for i, p in enumerate(pairs)]

    def _flat(self, result: ClassifyResult) -> dict[str, list[Any]]:
        """Columns for a table: `scores` becomes one `score_<label>` column per label."""
        columns = self.columns(result)
        scores = columns.pop("scores", None)
        if scores is not None:
            for label in self.labels:
                columns[f"score_{label}"] = [row[label] for row in scores]
        return columns

    # --- engine ----------------------------------------------------------------------------------------------------

    def _each(self, tokens: TokenBatch, batches: list[Any]) -> Iterator[tuple[FloatArray, EngineTiming]]:
        def one(rows: Any) -> tuple[FloatArray, EngineTiming]:
            if self._pool is not None:
                self._share(min(self.engine_threads, len(batches)))
            result = self.engine.run(tokens.select(rows))
            return result.logits, result.timing

        if self._pool is None:
            return map(one, batches)
        return self._pool.map(one, batches)

    def _count(self, timing: EngineTiming, request_id: str) -> None:
        self.stats.batches += 1
        self.stats.padded_tokens += timing.padded_tokens
        self.stats.devices.add(timing.device)
        self.observer.on_batch(BatchRecord(next(self._batch_ids), timing, (request_id,), 0))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


def _empty_batch() -> TokenBatch:
    return TokenBatch(ids=np.zeros((0, 0), dtype=np.int64), lengths=np.zeros(0, dtype=np.int64),
                      truncated=np.zeros(0, dtype=np.bool_))


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)  # None, or pandas' NaN for a null


def _text(value: Any, row: int, column: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | np.bytes_):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequestError(f"row {row} of column {column!r} is not valid UTF-8") from None
    what = "null" if _missing(value) else type(value).__name__
    raise InvalidRequestError(f"row {row} of column {column!r} is {what}, not a text")


def _arrow_with(batch: Any, columns: dict[str, list[Any]]) -> Any:
    import pyarrow

    arrays = [*batch.columns, *(pyarrow.array(values) for values in columns.values())]
    names = [*batch.schema.names, *columns]
    kind = pyarrow.Table if isinstance(batch, pyarrow.Table) else pyarrow.RecordBatch
    return kind.from_arrays(arrays, names=names)


@functools.lru_cache(maxsize=4)
def _shared(model_dir: str, options: tuple[tuple[str, Any], ...]) -> Classifier:
    # One model per Python worker process: Spark calls the function once per partition, in a reused worker.
    return Classifier(model_dir, **dict(options))


def classify_pandas(model_dir: str | Path, **options: Any) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """For Spark's `mapInPandas`: a function from an iterator of pandas DataFrames to one of DataFrames with the
    result columns added. The Classifier is built on the worker, once per Python process, on first use."""
    key = (str(model_dir), tuple(sorted(options.items())))

    def classify_frames(frames: Iterable[Any]) -> Iterator[Any]:
        classifier = _shared(*key)
        for frame in frames:
            yield classifier(frame)

    return classify_frames
