"""A batch of :class:`~shardify.reader.mapview.MapDataset` samples decoded field by field.

Both layouts give a batch as columns (:class:`FieldBatch`, :mod:`~shardify.reader.io.columns`):
a per-sample shard's fields as ``Spans`` of the batch buffer, a chunked shard's stacked fields
as ``Rows`` already gathered. Without ``transform=`` and ``map=``, and when
every output field is ``__key__``, a ``.npy`` field whose samples share one header (dtype and
shape: the whole batch is one array, no per-sample header parsing) or a ``cls`` label,
:func:`fast_outputs` makes the batch's outputs at a few array operations per field: the same
values as the per-sample decoders (``.npy``: a new native-order array per sample, here rows of
one new batch array; ``cls``: an int). Anything else goes through the sample processor one
sample at a time, from :func:`sample_dict` (each field's bytes, no tar parsing).

A fast batch is a :class:`BatchList`: the per-sample outputs (row views of the batch array),
which also holds each column already stacked, so :func:`collate` (``MapDataset.collate``)
hands a ``DataLoader`` the batch in one step where ``default_collate`` would convert and stack
each sample; for any other list it is ``default_collate``. Inside a worker either way the batch
is made in shared memory the worker reuses (:mod:`~shardify.reader.mapslots`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from shardify.errors import ArrayFormatError
from shardify.npy import npy_layout
from shardify.reader.io.columns import Column, Rows, Spans, uniform_rows
from shardify.reader.mapslots import collate_in_slot, columns_in_slot

__all__ = ["FieldBatch", "BatchList", "fast_outputs", "sample_dict", "collate"]

_HEAD_MAX = 4096
"""Bytes of a ``.npy`` member read for its header (a longer header: the per-sample path)."""


@dataclass
class FieldBatch:
    """A batch's samples as columns: ``keys()`` (made once, on first use), each sample's shard
    and byte offset, and one column per field."""

    make_keys: Callable[[], list[str]]
    urls: list[str]
    offsets: list[int]
    fields: dict[str, Column]
    _keys: list[str] | None = field(default=None, repr=False)

    def keys(self) -> list[str]:
        if self._keys is None:
            self._keys = self.make_keys()
        return self._keys


class BatchList(list[Any]):
    """A batch's outputs, one per sample, and each output column stacked (a tensor, or the
    keys' list): what ``default_collate`` would make of them."""

    def __init__(self, outputs: list[Any], stacked: list[Any]) -> None:
        super().__init__(outputs)
        self.stacked, self.size = stacked, len(outputs)


def collate(batch: list[Any]) -> Any:
    """``default_collate(batch)``, in one step for a :class:`BatchList` as it was made; inside a
    DataLoader worker the batch's tensors are made in (or copied into) one shared storage the
    worker reuses once the main process has freed the batch (:mod:`~shardify.reader.mapslots`)."""
    if isinstance(batch, BatchList) and len(batch) == batch.size:
        return columns_in_slot(batch.stacked[0] if len(batch.stacked) == 1 else batch.stacked)
    return collate_in_slot(batch)


def sample_dict(batch: FieldBatch, j: int) -> dict[str, object]:
    """Sample ``j`` as the shard reader gives it: ``__key__``, ``__shard__``, ``__offset__``
    and each field it has (bytes, or a row view of a stacked field)."""
    out: dict[str, object] = {"__key__": batch.keys()[j], "__shard__": batch.urls[j], "__offset__": batch.offsets[j]}
    for ext, column in batch.fields.items():
        v = column.value(j)
        if v is not None:
            out[ext] = v
    return out


def fast_outputs(batch: FieldBatch, fields: Sequence[str], n: int) -> BatchList | None:
    """The outputs of the ``n`` samples of ``batch`` for ``fields`` (see the module); None when
    a field is not one of those kinds, or not alike in every sample."""
    columns: list[Sequence[Any]] = []
    stacked: list[Any] = []
    for name in fields:
        if name == "__key__":
            columns.append(batch.keys())
            stacked.append(batch.keys())
            continue
        column = batch.fields.get(name)
        kind = name.rpartition(".")[2]
        if column is None:
            return None
        if kind == "npy":
            array = _npy_batch(column, n)
            if array is None:
                return None
            columns.append(list(array))
            stacked.append(torch.from_numpy(array))
        elif kind == "cls" and isinstance(column, Spans):
            labels = _labels(column, n)
            if labels is None:
                return None
            columns.append(labels)
            stacked.append(torch.tensor(labels))
        else:
            return None
    return BatchList(list(columns[0]) if len(columns) == 1 else list(zip(*columns)), stacked)


def _native(array: np.ndarray) -> np.ndarray | None:
    """``array`` in native byte order and C order (a new array when it has to change); None for
    dtypes the per-sample decoder turns into something else (objects, structured raw views)."""
    dtype = array.dtype
    if dtype.hasobject or dtype.names is not None:
        return None
    if not dtype.isnative:
        return array.astype(dtype.newbyteorder("="), order="C")
    return np.ascontiguousarray(array)


def _npy_batch(column: Column, n: int) -> np.ndarray | None:
    """The ``.npy`` field of every sample as one new ``[n, *shape]`` array, when they share one header."""
    if isinstance(column, Rows):
        return _native(column.array)
    if not isinstance(column, Spans) or column.present is not None or not n:
        return None
    data, at, size = column.data, column.at, column.size
    first = int(at[0])
    head = data[first : first + min(int(size[0]), _HEAD_MAX)].tobytes()
    try:
        dtype, shape, fortran, nbytes, offset = npy_layout(head)
    except ArrayFormatError:
        return None
    if fortran or dtype.hasobject or dtype.names is not None or np.any(size != offset + nbytes):
        return None
    template = np.frombuffer(head[:offset], np.uint8)
    block = uniform_rows(data, at, offset + nbytes)  # samples alike, one after another
    if block is not None:
        if np.any(block[:, :offset] != template):
            return None
        out = np.array(block[:, offset:])
    else:
        if np.any(data[at[:, None] + np.arange(offset)] != template):
            return None
        out = np.empty((n, nbytes), np.uint8)
        for j, a in enumerate((at + offset).tolist()):
            out[j] = data[a : a + nbytes]
    return _native(out.view(dtype).reshape(n, *shape))


def _labels(column: Spans, n: int) -> list[int] | None:
    """Each sample's ``cls`` as an int (ASCII decimal, surrounding blanks allowed; up to 18
    plain digits at once for the batch)."""
    if column.present is not None:
        return None
    size, data = column.size, column.data
    if n and 1 <= int(size.min()) and int(size.max()) <= 18 and len(data):  # plain digits: one array operation
        width = np.arange(int(size.max()))
        digits = data[np.minimum(column.at[:, None] + width, len(data) - 1)].astype(np.int64) - ord("0")
        used = width < size[:, None]
        if np.all(((digits >= 0) & (digits <= 9)) | ~used):
            scale = np.where(used, 10 ** np.maximum(size[:, None] - 1 - width, 0), 0)
            labels: list[int] = (digits * scale).sum(axis=1).tolist()
            return labels
    view = data.data
    try:
        return [int(bytes(view[a : a + s])) for a, s in zip(column.at.tolist(), column.size.tolist())]
    except ValueError:
        return None
