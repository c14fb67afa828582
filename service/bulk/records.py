"""What the bulk readers yield: an input text to classify, or a bad input with where it was and why."""

from __future__ import annotations

from dataclasses import dataclass

Key = str | int | float  # an input's own id (JSON lines, CSV), a frame's user id, or its line number


@dataclass(frozen=True, slots=True)
class Item:
    """One text (or text pair) of the input. `position` counts every input, bad ones included, from 0: the order
    output is written in, and what `--resume` counts."""

    position: int
    line: int  # 1-based line number of the input (CSV: of the record's first line; frames: the frame number)
    key: Key  # the input's id, else its line number
    text: str
    pair: str | None = None


@dataclass(frozen=True, slots=True)
class BadItem:
    """An input that cannot be classified. `code` is stable (the error codes of the HTTP API where one fits)."""

    position: int
    line: int
    code: str  # invalid_json | invalid_utf8 | missing_field | invalid_field | text_too_long | frame_truncated ...
    message: str
    fatal: bool = False  # the rest of the input cannot be read (a truncated frame): the run stops whatever --on-error

    def describe(self, source: str) -> str:
        return f"{source}:{self.line}: {self.code}: {self.message}"


Input = Item | BadItem
