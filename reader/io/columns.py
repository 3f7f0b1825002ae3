"""A batch's fields as columns, whichever layout they were read from.

:class:`Spans`: each sample's own bytes of a field, in one buffer (a per-sample shard's
members, a chunked shard's variable members). :class:`Rows`: a field every sample of the batch
has with one dtype and shape, as one array (a chunked shard's stacked members).
:class:`Values`: anything else, one value per sample (bytes, an array row, or None).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Spans", "Rows", "Values", "Column"]


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
