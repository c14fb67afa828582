"""The length-bucketed queue the engine thread takes batches from, and the rule that forms a batch.

Not thread-safe on purpose: the batcher holds its one lock around every call, so this module stays plain,
deterministic Python that tests drive directly.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from glassbox.service.types import TokenBatch

T = TypeVar("T")


class Ticket(Generic[T]):
    """One admitted request as the queue sees it. `owner` is whatever the batcher needs to answer it.

    Withdrawing a ticket (disconnect, deadline, failure, shutdown) only marks it: its items stay in their
    lanes until a batch formation walks past them, so withdrawal costs O(1) whatever the queue length.
    """

    __slots__ = ("deadline_ns", "owner", "queued_items", "queued_tokens", "tokens", "withdrawn")

    def __init__(self, owner: T, tokens: TokenBatch, deadline_ns: int) -> None:
        self.owner = owner
        self.tokens = tokens
        self.deadline_ns = deadline_ns
        self.queued_items = 0
        self.queued_tokens = 0
        self.withdrawn = False


@dataclass(frozen=True, slots=True)
class Item(Generic[T]):
    """One row of a request's TokenBatch, waiting in the lane of its length bucket."""

    seq: int  # arrival order across all lanes
    ticket: Ticket[T]
    row: int  # row in ticket.tokens
    length: int


@dataclass(frozen=True, slots=True)
class Taken(Generic[T]):
    items: tuple[Item[T], ...]  # the next batch, empty when nothing live was queued
    expired: tuple[tuple[Ticket[T], int], ...]  # tickets found past their deadline, with the items dropped


class BucketQueue(Generic[T]):
    """One FIFO lane per length bucket; live counts are kept exact for admission control."""

    def __init__(self, length_buckets: Sequence[int]) -> None:
        if not length_buckets:
            raise ValueError("the queue needs at least one length bucket")
        self.buckets = tuple(length_buckets)
        self._lanes: list[deque[Item[T]]] = [deque() for _ in self.buckets]
        self._seq = 0
        self.requests = 0  # tickets with at least one live queued item
        self.items = 0
        self.tokens = 0  # real tokens of the live queued items

    def bucket_of(self, length: int) -> int:
        """Index of the smallest bucket that holds `length`; longer items share the last bucket."""
        return min(bisect.bisect_left(self.buckets, length), len(self.buckets) - 1)

    def push(self, ticket: Ticket[T]) -> None:
        lengths: list[int] = ticket.tokens.lengths.tolist()
        for row, length in enumerate(lengths):
            self._lanes[self.bucket_of(length)].append(Item(self._seq, ticket, row, length))
            self._seq += 1
        ticket.queued_items = len(lengths)
        ticket.queued_tokens = sum(lengths)
        if lengths:
            self.requests += 1
            self.items += len(lengths)
            self.tokens += ticket.queued_tokens

    def withdraw(self, ticket: Ticket[T]) -> int:
        """Drop the ticket's items that are still queued; returns how many. Idempotent."""
        if ticket.withdrawn:
            return 0
        ticket.withdrawn = True
        dropped = ticket.queued_items
        if dropped:
            self.requests -= 1
            self.items -= dropped
            self.tokens -= ticket.queued_tokens
            ticket.queued_items = ticket.queued_tokens = 0
        if self.items == 0:
            self._clear_dead()
        return dropped

    def withdraw_all(self) -> list[tuple[Ticket[T], int]]:
        """Every live ticket withdrawn, with its dropped item count (shutdown)."""
        live: dict[int, Ticket[T]] = {}
        for lane in self._lanes:
            for item in lane:
                if not item.ticket.withdrawn:
                    live.setdefault(id(item.ticket), item.ticket)
        return [(ticket, self.withdraw(ticket)) for ticket in live.values()]

    def take(self, now_ns: int, max_rows: int, max_tokens: int, max_padding_ratio: float) -> Taken[T]:
        """Remove and return the next batch.

        The rule: the batch belongs to the bucket of the oldest live item, and takes that bucket's items
        in arrival order while the batch stays within `max_rows` and `max_tokens` (rows x longest). If room
        is left, it tops up from the bucket just below, then the one just above, in their arrival order,
        while padding stays at or under `max_padding_ratio` of the padded tokens. Each lane is read as a
        FIFO and reading stops at its first item that does not fit, so nothing is overtaken inside a lane,
        and since the oldest item always picks the bucket, nothing waits forever. The first item is taken
        even if it alone exceeds `max_tokens`. Items whose deadline passed (at `now_ns`) are dropped on the
        way with every other queued item of their request.
        """
        expired: list[tuple[Ticket[T], int]] = []
        heads = [(lane[0].seq, k) for k, lane in enumerate(self._lanes) if self._live_head(lane, now_ns, expired)]
        if not heads:
            return Taken((), tuple(expired))
        primary = min(heads)[1]
        batch: _Forming[T] = _Forming(max_rows, max_tokens)
        self._fill(batch, self._lanes[primary], now_ns, expired, None)
        for neighbour in (primary - 1, primary + 1):
            if 0 <= neighbour < len(self._lanes) and batch.rows < max_rows:
                self._fill(batch, self._lanes[neighbour], now_ns, expired, max_padding_ratio)
        if self.items == 0:
            self._clear_dead()
        return Taken(tuple(batch.items), tuple(expired))

    def _fill(
        self,
        batch: _Forming[T],
        lane: deque[Item[T]],
        now_ns: int,
        expired: list[tuple[Ticket[T], int]],
        max_padding_ratio: float | None,
    ) -> None:
        while self._live_head(lane, now_ns, expired) and batch.fits(lane[0], max_padding_ratio):
            item = lane.popleft()
            batch.add(item)
            ticket = item.ticket
            ticket.queued_items -= 1
            ticket.queued_tokens -= item.length
            self.items -= 1
            self.tokens -= item.length
            if ticket.queued_items == 0:
                self.requests -= 1

    def _live_head(self, lane: deque[Item[T]], now_ns: int, expired: list[tuple[Ticket[T], int]]) -> bool:
        """Pop withdrawn and expired items off the lane's head; True if a live item is left there."""
        while lane:
            ticket = lane[0].ticket
            if not ticket.withdrawn and ticket.deadline_ns > now_ns:
                return True
            if not ticket.withdrawn:
                expired.append((ticket, self.withdraw(ticket)))
            if lane:  # withdraw() may have cleared every lane
                lane.popleft()
        return False

    def _clear_dead(self) -> None:
        # Nothing live is queued, so every remaining item belongs to a withdrawn ticket: free them now
        # rather than holding their requests' token arrays until the next batch walks past.
        for lane in self._lanes:
            lane.clear()


class _Forming(Generic[T]):
    """The batch being formed: rows, longest length and real tokens, for the fit test."""

    def __init__(self, max_rows: int, max_tokens: int) -> None:
        self.items: list[Item[T]] = []
        self.max_rows = max_rows
        self.max_tokens = max_tokens
        self.width = 0
        self.real = 0

    @property
    def rows(self) -> int:
        return len(self.items)

    def fits(self, item: Item[T], max_padding_ratio: float | None) -> bool:
        if not self.items:
            return True  # one item never waits for a batch it could not fit in anyway
        rows = self.rows + 1
        padded = rows * max(self.width, item.length)
        if rows > self.max_rows or padded > self.max_tokens:
            return False
        return max_padding_ratio is None or 1.0 - (self.real + item.length) / padded <= max_padding_ratio

    def add(self, item: Item[T]) -> None:
        self.items.append(item)
        self.width = max(self.width, item.length)
        self.real += item.length


def stack_rows(items: Sequence[Item[T]], pad_id: int) -> TokenBatch:
    """The items' rows as one TokenBatch, right-padded with `pad_id` to the longest of them. Token type ids come
    along when any item's request has them; rows of requests without them get type 0, which is what they mean."""
    width = max(item.length for item in items)
    stacked = np.full((len(items), width), pad_id, dtype=np.int64)  # [n, width]
    lengths = np.empty(len(items), dtype=np.int64)  # [n]
    truncated = np.empty(len(items), dtype=np.bool_)  # [n]
    typed = any(item.ticket.tokens.type_ids is not None for item in items)
    types = np.zeros((len(items), width), dtype=np.int64) if typed else None  # [n, width]
    for i, item in enumerate(items):
        source = item.ticket.tokens
        stacked[i, : item.length] = source.ids[item.row, : item.length]
        lengths[i] = item.length
        truncated[i] = source.truncated[item.row]
        if types is not None and source.type_ids is not None:
            types[i, : item.length] = source.type_ids[item.row, : item.length]
    return TokenBatch(ids=stacked, lengths=lengths, truncated=truncated, type_ids=types)


def by_ticket(items: Sequence[Item[T]]) -> list[tuple[Ticket[T], list[int], list[int]]]:
    """The batch's items grouped by request, in order of first appearance: (ticket, its rows in the
    request's TokenBatch, their positions in the batch)."""
    groups: dict[int, tuple[Ticket[T], list[int], list[int]]] = {}
    for position, item in enumerate(items):
        _, rows, positions = groups.setdefault(id(item.ticket), (item.ticket, [], []))
        rows.append(item.row)
        positions.append(position)
    return list(groups.values())
