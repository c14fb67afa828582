"""A progress bar for a load run, drawn with rich on stderr so stdout stays clean for --json."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

REFRESH_S = 0.25


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Where a run stands."""

    elapsed_s: float
    duration_s: float
    planned: int
    scheduled: int
    recorded: int
    ok: int
    errors: int
    outstanding: int


def describe(s: Snapshot) -> str:
    return (f"sent {s.scheduled}/{s.planned}  ok {s.ok}  errors {s.errors}  outstanding {s.outstanding}  "
            f"{s.elapsed_s:.0f}/{s.duration_s:.0f} s")


async def show_progress(snapshot: Callable[[], Snapshot], every_s: float = REFRESH_S,
                        console: Console | None = None) -> None:
    """Redraw until cancelled. Refreshes are driven from here rather than rich's own thread, so the bar costs
    one redraw per `every_s` on the generator's loop and nothing else."""
    with Progress(TextColumn("[bold]load"), BarColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console or Console(stderr=True), auto_refresh=False) as bar:
        first = snapshot()
        task = bar.add_task(describe(first), total=max(1, first.planned))
        try:
            while True:
                await asyncio.sleep(every_s)
                now = snapshot()
                bar.update(task, completed=now.recorded, description=describe(now))
                bar.refresh()
        finally:
            now = snapshot()
            bar.update(task, completed=now.recorded, description=describe(now))
            bar.refresh()
