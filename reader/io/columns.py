"""A batch's fields as columns, whichever layout they were read from.

:class:`Spans`: each sample's own bytes of a field, in one buffer (a per-sample shard's
members, a chunked shard's variable members). :class:`Rows`: a field every sample of the batch
has with one dtype and shape, as one array (a chunked shard's stacked members).
:class:`Values`: anything else, one value per sample (bytes, an array row, or None).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Spans", "Rows", "Values", "Column", "uniform_rows"]


@dataclass(frozen=True, slots=True)
class Spans:
    """A field's bytes in a batch: sample ``j``'s are ``data[at[j]:at[j] + size[j]]``;
    ``present[j]`` False: sample ``j`` lacks the field (None: every sample has it)."""

    data: np.ndarray
    at: np.ndarray
    size: np.ndarray
    present: np.ndarray | None = None

    def value(self, j: int) -> bytes | None:
        if self.present is not None and not self.present[j]:
            return None
        a = int(self.at[j])
        return self.data[a : a + int(self.size[j])].tobytes()


@dataclass(frozen=True, slots=True)
class Rows:
    """A field every sample of the batch has, as one array in its stored dtype: sample ``j``
    is ``array[j]``."""

    array: np.ndarray

    def value(self, j: int) -> np.ndarray:
        row: np.ndarray = self.array[j]
        return row


@dataclass(frozen=True, slots=True)
class Values:
    """A field as one value per sample (None: the sample lacks it)."""

    values: list[bytes | np.ndarray | None]

    def value(self, j: int) -> bytes | np.ndarray | None:
        return self.values[j]


Column = Spans | Rows | Values


def uniform_rows(data: np.ndarray, at: np.ndarray, width: int) -> np.ndarray | None:
    """``data[at[j]:at[j] + width]`` for every ``j`` as one read-only ``[len(at), width]`` view,
    when the rows start at one stride of at least ``width`` (samples alike, one after another);
    None otherwise. ``at`` is not empty and each row lies within ``data``."""
    stride = int(at[1] - at[0]) if len(at) > 1 else width
    if stride < width or not np.all(np.diff(at) == stride):
        return None
    view: np.ndarray = np.lib.stride_tricks.as_strided(
        data[int(at[0]) :], shape=(len(at), width), strides=(stride, 1), writeable=False
    )
    return view
