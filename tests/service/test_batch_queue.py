"""The batch-forming rule, the throughput meter, admission and limits, driven directly (no threads)."""

from __future__ import annotations

import numpy as np
import pytest

from glassbox.service.batching.admission import ShedMeter, predicted_wait_s, refusal, refusal_error, retry_after_s
from glassbox.service.batching.cost import Cost
from glassbox.service.batching.limits import BatcherLimits
from glassbox.service.batching.queue import BucketQueue, Item, Taken, Ticket, by_ticket, stack_rows
from glassbox.service.batching.throughput import ThroughputMeter
from glassbox.service.errors import NotReadyError, OverloadedError
from glassbox.service.settings import Settings
from glassbox.service.types import TokenBatch

FAR = 10**18  # a deadline that never passes


def tokens(*lengths: int, first_id: int = 1) -> TokenBatch:
    """Rows whose ids are first_id, first_id+1, ... so every row is recognisable; pad id 0."""
    width = max(lengths)
    ids = np.zeros((len(lengths), width), dtype=np.int64)
    next_id = first_id
    for row, length in enumerate(lengths):
        ids[row, :length] = np.arange(next_id, next_id + length)
        next_id += length
    return TokenBatch(ids=ids, lengths=np.array(lengths, dtype=np.int64), truncated=np.zeros(len(lengths), bool))


def push(queue: BucketQueue[str], name: str, *lengths: int, deadline_ns: int = FAR) -> Ticket[str]:
    ticket = Ticket(name, tokens(*lengths), deadline_ns)
    queue.push(ticket)
    return ticket


def lengths_of(items: tuple[Item[str], ...]) -> list[int]:
    return [item.length for item in items]


def take(
    queue: BucketQueue[str], rows: int = 64, tokens_: int = 10_000, padding: float = 0.25, now: int = 0
) -> Taken[str]:
    return queue.take(now, rows, tokens_, padding)


def test_packs_up_to_max_rows_then_max_padded_tokens() -> None:
    queue: BucketQueue[str] = BucketQueue((64,))
    push(queue, "a", *([10] * 6))
    assert lengths_of(take(queue, rows=4).items) == [10] * 4  # the row cap binds
    assert lengths_of(take(queue, rows=4).items) == [10] * 2
    push(queue, "b", 20, 20, 20, 20, 5)
    first = take(queue, tokens_=64).items  # 3 x 20 = 60 fits, 4 x 20 = 80 does not
    assert lengths_of(first) == [20, 20, 20]
    assert lengths_of(take(queue, tokens_=64).items) == [20, 5]  # 2 x 20 padded


def test_an_item_larger_than_the_token_budget_runs_alone() -> None:
    queue: BucketQueue[str] = BucketQueue((64,))
    push(queue, "big", 50, 3)
    assert lengths_of(take(queue, tokens_=32).items) == [50]
    assert lengths_of(take(queue, tokens_=32).items) == [3]
    assert queue.items == 0 and take(queue).items == ()


def test_the_oldest_items_bucket_is_served_first_and_fills_in_arrival_order() -> None:
    queue: BucketQueue[str] = BucketQueue((8, 16, 32))
    for name, length in (("a", 30), ("b", 5), ("c", 31), ("d", 6), ("e", 29), ("f", 7)):
        push(queue, name, length)
    first = take(queue).items
    assert [item.ticket.owner for item in first] == ["a", "c", "e"]  # bucket 32; bucket 8 is not adjacent
    second = take(queue).items
    assert [item.ticket.owner for item in second] == ["b", "d", "f"]


def test_neighbouring_bucket_tops_up_only_while_padding_stays_bounded() -> None:
    queue: BucketQueue[str] = BucketQueue((8, 16, 32))
    for name, length in (("a", 14), ("b", 7), ("c", 16), ("d", 3)):
        push(queue, name, length)
    # bucket 16 first: 14, 16 (width 16, 30 real); then bucket 8: 7 -> 37/48 real, padding 0.23 <= 0.25;
    # 3 -> 40/64 real, padding 0.375 > 0.25, so the lane stops there.
    assert [item.ticket.owner for item in take(queue).items] == ["a", "c", "b"]
    assert [item.ticket.owner for item in take(queue).items] == ["d"]
    push(queue, "e", 14)
    push(queue, "f", 7)
    assert [item.ticket.owner for item in take(queue, padding=0.0).items] == ["e"]  # no top-up allowed


def test_nothing_overtakes_inside_a_lane_and_the_oldest_is_never_starved() -> None:
    queue: BucketQueue[str] = BucketQueue((64,))
    push(queue, "short", 4)
    push(queue, "long", 40)
    push(queue, "short2", 4)
    # "long" does not fit next to "short" (2 x 40 > 64); "short2" would, but does not jump the lane
    assert [item.ticket.owner for item in take(queue, tokens_=64).items] == ["short"]
    assert [item.ticket.owner for item in take(queue, tokens_=64).items] == ["long"]
    assert [item.ticket.owner for item in take(queue, tokens_=64).items] == ["short2"]


def test_counts_track_requests_items_and_tokens() -> None:
    queue: BucketQueue[str] = BucketQueue((8, 32))
    a = push(queue, "a", 5, 20)
    push(queue, "b", 6)
    assert (queue.requests, queue.items, queue.tokens) == (2, 3, 31)
    taken = take(queue).items  # bucket 8: a's 5 and b's 6; bucket 32 top-up: 20 -> padding 0.48, refused
    assert lengths_of(taken) == [5, 6]
    assert (queue.requests, queue.items, queue.tokens) == (1, 1, 20)
    assert a.queued_items == 1 and a.queued_tokens == 20


def test_withdrawn_tickets_leave_the_counts_at_once_and_never_come_out() -> None:
    queue: BucketQueue[str] = BucketQueue((8, 32))
    a = push(queue, "a", 5, 20, 7)
    push(queue, "b", 6)
    assert queue.withdraw(a) == 3
    assert queue.withdraw(a) == 0  # idempotent
    assert (queue.requests, queue.items, queue.tokens) == (1, 1, 6)
    assert [item.ticket.owner for item in take(queue).items] == ["b"]
    assert take(queue).items == ()


def test_expired_items_are_dropped_with_the_rest_of_their_request() -> None:
    queue: BucketQueue[str] = BucketQueue((8, 32))
    late = push(queue, "late", 5, 20, deadline_ns=100)
    push(queue, "ok", 6, deadline_ns=1000)
    taken = take(queue, now=100)  # a deadline equal to now has passed
    assert [item.ticket.owner for item in taken.items] == ["ok"]
    assert taken.expired == ((late, 2),)
    assert queue.items == 0 and late.withdrawn


def test_withdraw_all_returns_each_live_ticket_once() -> None:
    queue: BucketQueue[str] = BucketQueue((8, 32))
    a = push(queue, "a", 5, 20, 6)
    b = push(queue, "b", 7)
    gone = push(queue, "gone", 3)
    queue.withdraw(gone)
    assert sorted((t.owner, n) for t, n in queue.withdraw_all()) == [("a", 3), ("b", 1)]
    assert a.withdrawn and b.withdrawn and queue.items == 0


def test_stack_rows_right_pads_with_the_pad_id_and_keeps_rows() -> None:
    queue: BucketQueue[str] = BucketQueue((64,))
    push(queue, "a", 3, 1)
    ticket_b = Ticket("b", tokens(2, first_id=50), FAR)
    queue.push(ticket_b)
    batch = stack_rows(take(queue).items, pad_id=9)
    assert batch.ids.tolist() == [[1, 2, 3], [4, 9, 9], [50, 51, 9]]
    assert batch.lengths.tolist() == [3, 1, 2]


def test_stack_rows_carries_token_types_and_gives_untyped_rows_type_zero() -> None:
    queue: BucketQueue[str] = BucketQueue((64,))
    pair = tokens(4, 2, first_id=1)
    pair = TokenBatch(pair.ids, pair.lengths, pair.truncated, type_ids=np.array([[0, 0, 1, 1], [0, 1, 0, 0]]))
    queue.push(Ticket("pair", pair, FAR))
    push(queue, "single", 3, 1)
    batch = stack_rows(take(queue).items, pad_id=9)
    assert batch.ids.tolist() == [[1, 2, 3, 4], [5, 6, 9, 9], [1, 2, 3, 9], [4, 9, 9, 9]]
    assert batch.type_ids is not None
    assert batch.type_ids.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert batch.select([1, 2]).type_ids.tolist() == [[0, 1, 0], [0, 0, 0]]  # type: ignore[union-attr]
    untyped = BucketQueue[str]((64,))
    push(untyped, "single", 3)
    assert stack_rows(take(untyped).items, pad_id=9).type_ids is None


def test_by_ticket_maps_batch_positions_back_to_request_rows() -> None:
    queue: BucketQueue[str] = BucketQueue((4, 64))
    a = push(queue, "a", 3, 40, 2)
    b = push(queue, "b", 1)
    items = take(queue, padding=0.0).items  # bucket 4: a row 0, a row 2, b row 0
    assert [(t.owner, rows, positions) for t, rows, positions in by_ticket(items)] == [
        ("a", [0, 2], [0, 1]), ("b", [0], [2])
    ]
    assert (a.queued_items, b.queued_items) == (1, 0)


def test_throughput_meter_measures_busy_time_per_device_over_a_window() -> None:
    meter = ThroughputMeter(window=2)
    assert (meter.items_per_s, meter.tokens_per_s, meter.device) == (0.0, 0.0, "")
    meter.record("cuda:0", rows=10, tokens=100, busy_ns=10**9)
    meter.record("cuda:0", rows=30, tokens=300, busy_ns=10**9)
    assert meter.items_per_s == 20.0 and meter.tokens_per_s == 200.0
    meter.record("cuda:0", rows=50, tokens=500, busy_ns=10**9)  # the first sample leaves the window
    assert meter.items_per_s == 40.0
    meter.record("cpu", rows=2, tokens=20, busy_ns=10**9)  # a new device starts a new window
    assert (meter.items_per_s, meter.tokens_per_s, meter.device) == (2.0, 20.0, "cpu")


def test_retry_after_follows_the_predicted_wait_in_whole_seconds_between_one_and_the_ceiling() -> None:
    assert retry_after_s(None) == 1.0  # nothing measured yet
    assert retry_after_s(0.01) == 1.0
    assert retry_after_s(5.0) == 5.0
    assert retry_after_s(5.01) == 6.0  # rounded up
    assert retry_after_s(1e9) == 60.0


def test_the_predicted_wait_counts_the_full_batches_ahead_and_the_first_free_engine_thread() -> None:
    cost = Cost(fixed_ns=5e6, per_token_ns=1e5)  # 5 ms a batch + 0.1 ms a token
    assert predicted_wait_s(10, 300, 8, None, 0.0) is None  # no cost measured: no prediction
    # 7 queued rows fit in the new request's own batch of 8: it waits only for an engine thread to come free
    assert predicted_wait_s(7, 210, 8, cost, 0.02) == pytest.approx(0.02)
    # 16 queued rows are two full batches ahead: 2 x 5 ms + 480 tokens x 0.1 ms, after the 20 ms
    assert predicted_wait_s(16, 480, 8, cost, 0.02) == pytest.approx(0.02 + 0.010 + 0.048)
    # two engine threads run those batches side by side
    assert predicted_wait_s(16, 480, 8, cost, 0.0, runners=2) == pytest.approx((0.010 + 0.048) / 2)
    # 20 queued: two full batches ahead (16 rows' share of the tokens); the last 4 ride with the new request
    assert predicted_wait_s(20, 600, 8, cost, 0.0) == pytest.approx(0.010 + 0.048)


LIMITS = BatcherLimits(max_batch_size=8, max_batch_tokens=512, max_queue_requests=2, max_queue_tokens=100,
                       length_buckets=(16, 64), max_queue_wait_s=0.1)


def test_admission_refuses_for_draining_requests_and_tokens() -> None:
    assert refusal(LIMITS, False, 1, 90, 10) is None
    assert refusal(LIMITS, True, 0, 0, 1) == "draining"
    assert refusal(LIMITS, False, 2, 10, 1) == "queue_full_requests"
    assert refusal(LIMITS, False, 1, 90, 11) == "queue_full_tokens"
    assert refusal(LIMITS, False, 0, 0, 500) is None  # an empty queue takes even an oversized request


def test_admission_refuses_a_predicted_wait_over_the_bound_or_past_the_deadline() -> None:
    assert refusal(LIMITS, False, 1, 10, 5, wait_s=0.1) is None  # at the bound
    assert refusal(LIMITS, False, 1, 10, 5, wait_s=0.11) == "predicted_wait"
    assert refusal(LIMITS, False, 1, 10, 5, wait_s=None) is None  # nothing measured: the hard caps alone
    # 50 ms of wait and 20 ms of its own run do not fit in 60 ms of deadline
    assert refusal(LIMITS, False, 1, 10, 5, wait_s=0.05, own_s=0.02, deadline_left_s=0.06) == "predicted_wait"
    assert refusal(LIMITS, False, 1, 10, 5, wait_s=0.05, own_s=0.02, deadline_left_s=0.08) is None
    assert refusal(LIMITS, False, 0, 0, 5, wait_s=0.0, own_s=1.0, deadline_left_s=0.5) is None  # nothing ahead
    # No full batch queued ahead: the request rides in the next batch, so a slow engine alone refuses only what would
    # miss its deadline, never by the wait bound.
    assert refusal(LIMITS, False, 1, 10, 5, wait_s=0.3, queue_ahead=False) is None
    assert refusal(LIMITS, False, 1, 10, 5, wait_s=0.3, own_s=0.1, deadline_left_s=0.35, queue_ahead=False) == (
        "predicted_wait")


def test_refusal_errors_carry_status_type_and_retry_after() -> None:
    draining = refusal_error("draining", LIMITS, 0, 0, 1, 100.0)
    assert isinstance(draining, NotReadyError)
    full = refusal_error("queue_full_tokens", LIMITS, 1, 90, 20, 2.2)
    assert isinstance(full, OverloadedError) and full.retry_after_s == 3.0
    assert "90 tokens queued" in full.message
    slow = refusal_error("predicted_wait", LIMITS, 1, 90, 20, 0.35)
    assert isinstance(slow, OverloadedError) and slow.retry_after_s == 1.0
    assert "350 ms" in slow.message and "over the 100 ms bound" in slow.message
    late = refusal_error("predicted_wait", LIMITS, 1, 90, 20, 0.05, own_s=0.02, deadline_left_s=0.06)
    assert "wait of 50 ms and the request's own 20 ms would end after its deadline, 60 ms away" in late.message
    assert "bound" not in late.message


def test_limits_from_settings_always_cover_max_length() -> None:
    settings = Settings(max_batch_size=4, max_batch_tokens=256, max_queue_requests=7, max_queue_tokens=999,
                        length_buckets=(16, 32, 64, 128))
    limits = BatcherLimits.from_settings(settings, max_length=100)
    assert limits.length_buckets == (16, 32, 64, 100)
    assert (limits.max_batch_size, limits.max_batch_tokens) == (4, 256)
    assert (limits.max_queue_requests, limits.max_queue_tokens) == (7, 999)
    assert limits.max_queue_wait_s == settings.max_queue_wait_ms / 1000
    assert limits.shed_window_s == settings.shed_window_ms / 1000 == 0.25


def test_shed_window_ms_zero_means_the_batcher_never_sheds() -> None:
    limits = BatcherLimits.from_settings(Settings(shed_window_ms=0), max_length=128)
    assert limits.shed_window_s == 0.0
    never, default = ShedMeter(), ShedMeter()
    for at_ns in range(0, 10_000_000, 1_000_000):  # ten refusals in 10 ms, nothing admitted
        never.refused(at_ns, limits.shed_window_s)
        default.refused(at_ns, 0.25)
    assert not never.shedding(10_000_000, limits.shed_window_s)
    assert default.shedding(10_000_000, 0.25)


@pytest.mark.parametrize(
    "changes",
    [{"max_batch_size": 0}, {"max_queue_tokens": -1}, {"length_buckets": ()}, {"length_buckets": (32, 16)},
     {"max_padding_ratio": 1.0}, {"max_queue_wait_s": 0.0}],
)
def test_limits_reject_nonsense(changes: dict[str, object]) -> None:
    values: dict[str, object] = {"max_batch_size": 1, "max_batch_tokens": 1, "max_queue_requests": 1,
                                 "max_queue_tokens": 1, "length_buckets": (8,)}
    values.update(changes)
    with pytest.raises(ValueError, match="invalid batcher limits"):
        BatcherLimits(**values)  # type: ignore[arg-type]


def test_the_shed_meter_weighs_recent_refusals_against_admissions() -> None:
    meter, second = ShedMeter(), 10**9
    assert not meter.shedding(0, 1.0)  # nothing refused: never shedding, even with nothing admitted
    for _ in range(10):
        meter.admitted(0, 1.0)
    for _ in range(9):
        meter.refused(0, 1.0)
    assert not meter.shedding(0, 1.0)  # 9 refused against 10 admitted
    meter.refused(0, 1.0)
    assert meter.shedding(0, 1.0)
    assert meter.shedding(second // 2, 1.0)  # both decay alike: the balance holds as they age...
    meter.admitted(second // 2, 1.0)
    assert not meter.shedding(second // 2, 1.0)  # ...until one more admission outweighs it
    meter.refused(second // 2, 1.0)
    assert meter.shedding(second // 2, 1.0)
    assert not meter.shedding(3 * second, 1.0)  # three windows on, what is left counts for less than one refusal
    meter.refused(60 * second, 1.0)  # a refusal long after is weighed against what is left of the admissions
    assert meter.shedding(60 * second, 1.0)
    assert not meter.shedding(60 * second, 0.0)  # no window: nothing weighs
