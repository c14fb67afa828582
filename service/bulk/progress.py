"""The progress bar of `glassbox classify` (rich, on stderr): bytes of input read, texts done, texts/s and ETA."""

from __future__ import annotations

import sys
import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress


class Progress:
    """Advanced once per window. The bar follows the input's bytes (a file's size is known before its lines are);
    the rate is texts per second since the start. A pipe has no size: then no bar, only the counts."""

    def __init__(self, total_bytes: int | None, *, enabled: bool) -> None:
        self._enabled = enabled
        self._start = time.perf_counter()
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None
        self._total = total_bytes

    def __enter__(self) -> Progress:
        if self._enabled:
            self._bar = RichProgress(
                TextColumn("classify"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                TextColumn("{task.fields[texts]} texts, {task.fields[rate]:.0f} texts/s"),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                console=Console(file=sys.stderr), transient=False)
            self._bar.start()
            self._task = self._bar.add_task("classify", total=self._total, texts=0, rate=0.0)
        return self

    def update(self, bytes_read: int, texts: int) -> None:
        if self._bar is None or self._task is None:
            return
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        self._bar.update(self._task, completed=bytes_read, texts=texts, rate=texts / elapsed)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._bar is not None:
            if kind is None and self._task is not None and self._total is not None:
                self._bar.update(self._task, completed=self._total)
            self._bar.stop()
