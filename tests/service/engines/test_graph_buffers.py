from __future__ import annotations

import numpy as np
import pytest
import torch

from glassbox.service.engines.graph_buffers import (
    BufferAddresses,
    StaticBuffers,
    check_addresses,
    empty_batch,
    pad_into,
)
from glassbox.service.errors import EngineError
from glassbox.service.types import Bucket, TokenBatch

PAD = 7


def batch_of(*rows: list[int]) -> TokenBatch:
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), PAD, dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    return TokenBatch(ids=ids, lengths=lengths, truncated=np.zeros(len(rows), dtype=np.bool_))


def test_pad_into_places_rows_top_left_and_pads_the_rest() -> None:
    ids = np.full((4, 6), -1, dtype=np.int64)  # [b, s], -1 shows any cell left unwritten
    mask = np.ones((4, 6), dtype=np.bool_)
    pad_into(ids, mask, batch_of([2, 10, 11, 3], [2, 12, 3]), PAD)
    assert ids.tolist() == [
        [2, 10, 11, 3, PAD, PAD],
        [2, 12, 3, PAD, PAD, PAD],
        [PAD] * 6,
        [PAD] * 6,
    ]
    assert mask.astype(int).tolist() == [
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 0, 0, 0, 0, 0],  # padding rows keep position 0 visible: never a fully masked row
        [1, 0, 0, 0, 0, 0],
    ]


def test_pad_into_overwrites_a_previous_larger_batch() -> None:
    ids = np.zeros((2, 4), dtype=np.int64)
    mask = np.zeros((2, 4), dtype=np.bool_)
    pad_into(ids, mask, batch_of([1, 2, 3, 4], [5, 6, 7, 8]), PAD)
    pad_into(ids, mask, batch_of([9]), PAD)
    assert ids.tolist() == [[9, PAD, PAD, PAD], [PAD] * 4]
    assert mask.astype(int).tolist() == [[1, 0, 0, 0], [1, 0, 0, 0]]


def test_pad_into_writes_token_types_and_zeroes_what_a_batch_does_not_type() -> None:
    ids = np.zeros((3, 5), dtype=np.int64)
    mask = np.zeros((3, 5), dtype=np.bool_)
    types = np.full((3, 5), -1, dtype=np.int64)  # [b, s], -1 shows any cell left unwritten
    pair = batch_of([2, 10, 3, 11, 3], [2, 12, 3])
    pair = TokenBatch(pair.ids, pair.lengths, pair.truncated, type_ids=np.array([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]))
    pad_into(ids, mask, pair, PAD, types)
    assert types.tolist() == [[0, 0, 0, 1, 1], [0] * 5, [0] * 5]
    pad_into(ids, mask, batch_of([5]), PAD, types)  # a batch without type ids leaves no stale segment B behind
    assert types.tolist() == [[0] * 5] * 3


def test_static_buffers_with_token_types_fill_the_device_view() -> None:
    buffers = StaticBuffers(4, 8, torch.device("cpu"), PAD, token_types=True)
    bucket = Bucket(2, 4)
    pair = batch_of([2, 10, 3, 11], [2, 3])
    buffers.fill(TokenBatch(pair.ids, pair.lengths, pair.truncated, type_ids=np.array([[0, 0, 1, 1], [0, 0, 0, 0]])),
                 bucket)
    view = buffers.type_view(bucket)
    assert view is not None and view.tolist() == [[0, 0, 1, 1], [0, 0, 0, 0]]
    assert StaticBuffers(4, 8, torch.device("cpu"), PAD).type_view(bucket) is None
    assert buffers.addresses().types == view.data_ptr()


def test_pad_into_with_no_rows_writes_only_valid_padding_rows() -> None:
    ids = np.zeros((3, 2), dtype=np.int64)
    mask = np.zeros((3, 2), dtype=np.bool_)
    pad_into(ids, mask, empty_batch(), PAD)
    assert (ids == PAD).all()
    assert mask[:, 0].all() and not mask[:, 1:].any()


@pytest.mark.parametrize(("rows", "width"), [(3, 2), (1, 5)])
def test_pad_into_refuses_a_batch_that_does_not_fit(rows: int, width: int) -> None:
    with pytest.raises(ValueError, match="does not fit"):
        pad_into(np.zeros((rows, width), np.int64), np.zeros((rows, width), np.bool_), batch_of([1, 2, 3], [4]), PAD)


def test_views_are_contiguous_prefixes_of_one_allocation() -> None:
    buffers = StaticBuffers(max_batch=4, max_length=8, device=torch.device("cpu"), pad_id=PAD)
    for bucket in (Bucket(4, 8), Bucket(2, 8), Bucket(1, 4), Bucket(3, 5)):
        ids, mask = buffers.views(bucket)
        assert ids.shape == (bucket.batch, bucket.length) and mask.shape == (bucket.batch, bucket.length)
        assert ids.is_contiguous() and mask.is_contiguous()
        assert ids.data_ptr() == buffers.ids.data_ptr() and mask.data_ptr() == buffers.mask.data_ptr()


def test_fill_writes_the_padded_batch_into_the_device_view_in_place() -> None:
    buffers = StaticBuffers(max_batch=4, max_length=8, device=torch.device("cpu"), pad_id=PAD)
    before = buffers.addresses()
    bucket = Bucket(2, 4)
    buffers.fill(batch_of([2, 10, 3], [2, 3]), bucket)
    ids, mask = buffers.views(bucket)
    assert ids.tolist() == [[2, 10, 3, PAD], [2, 3, PAD, PAD]]
    assert mask.tolist() == [[True, True, True, False], [True, True, False, False]]
    assert buffers.addresses() == before


def test_fill_rejects_a_bucket_larger_than_the_buffers() -> None:
    buffers = StaticBuffers(max_batch=2, max_length=8, device=torch.device("cpu"), pad_id=PAD)
    with pytest.raises(ValueError, match="larger than the static buffers"):
        buffers.fill(batch_of([1]), Bucket(4, 8))


def test_check_addresses_passes_when_nothing_moved() -> None:
    addresses = BufferAddresses(ids=1, mask=2, host_ids=3, host_mask=4)
    check_addresses(addresses, addresses, {"output 1x16": (9, 9)})


def test_check_addresses_names_every_moved_tensor() -> None:
    expected = BufferAddresses(ids=1, mask=2, host_ids=3, host_mask=4)
    actual = BufferAddresses(ids=1, mask=20, host_ids=3, host_mask=4)
    with pytest.raises(EngineError, match=r"moved \(mask, output 2x16\)"):
        check_addresses(expected, actual, {"output 2x16": (9, 10), "output 1x16": (5, 5)})
