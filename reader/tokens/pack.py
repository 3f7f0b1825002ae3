"""Packing rows: a sequence's tokens, labels, and its document segments as fixed-shape arrays.

A batch is a dict of arrays of ``batch_size`` rows (numpy here, tensors in the dataset):

- ``input_ids``, ``labels``: int64 ``[B, L]``; labels are the inputs shifted by one token
  (across document boundaries, as packed pre-training does); past the stream's take, inputs
  are ``pad_id`` and labels ``ignore_index``.
- ``num_tokens``: int64 ``[B]``, the row's real input tokens (``L`` but in the last sequence
  of a stream's take and in padding rows, 0).
- with ``position_ids``: int64 ``[B, L]``, each token's place in its *segment*: a row is cut into
  segments where a document begins and where the padding begins, so positions restart at 0
  at every document start (and at the row's start) and stay below ``L``.
- with ``documents``: ``segment_ids`` int32 ``[B, L]`` (0, 1, ... along the row; the padding is a
  segment of its own) and ``cu_seqlens`` int32 ``[B, L + 1]``: the row's segment boundaries
  ``0, e_1, ..., L``, padded to ``L + 1`` by repeating ``L`` (empty segments), a fixed shape
  that collates. :func:`varlen_args` turns a batch's into flash-attention's varlen arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["PackOptions", "pack_batch", "varlen_args"]


@dataclass(frozen=True)
class PackOptions:
    """What a packed batch holds besides ``input_ids`` and ``labels`` (see the module)."""

    pad_id: int = 0
    """Input id of padding positions (the last sequence of a take, padding rows)."""
    ignore_index: int = -100
    """Label of positions without a next token (the loss ignores them)."""
    position_ids: bool = False
    """Add ``position_ids``, restarting at 0 at every document start."""
    documents: bool = False
    """Add ``segment_ids`` and ``cu_seqlens`` for document masking (varlen attention)."""


def pack_batch(
    tokens: np.ndarray, read: list[int], doc_starts: list[list[int]] | None, options: PackOptions
) -> dict[str, np.ndarray]:
    """A batch's arrays (see the module) from ``tokens`` ``[B, L + 1]`` (any integer dtype): row
    ``r``'s first ``read[r]`` entries are its inputs and the next token, when there is one (0: a
    padding row; what lies past them is never used), and ``doc_starts[r]`` where documents begin
    in them (needed only for ``position_ids`` and ``documents``). One cast each for inputs and
    labels; padding is written only into the rows that have it."""
    rows, L = tokens.shape[0], tokens.shape[1] - 1
    input_ids = tokens[:, :L].astype(np.int64)
    labels = tokens[:, 1:].astype(np.int64)
    num_tokens = np.minimum(np.asarray(read, dtype=np.int64), L)
    for r, n in enumerate(read):
        if n <= L:  # the last sequence of a take, or a padding row
            input_ids[r, n:] = options.pad_id
            labels[r, max(n - 1, 0) :] = options.ignore_index
    out = {"input_ids": input_ids, "labels": labels, "num_tokens": num_tokens}
    if options.position_ids or options.documents:
        out.update(_segments(read, doc_starts or [[] for _ in read], rows, L, options))
    return out


def _segments(
    read: list[int], doc_starts: list[list[int]], rows: int, L: int, options: PackOptions
) -> dict[str, np.ndarray]:
    """``position_ids``, ``segment_ids`` and ``cu_seqlens`` of rows cut where a document begins,
    at 0 and where the padding begins: one mark per cut, then cumulative sums along the rows."""
    at_row: list[int] = []
    at_col: list[int] = []
    for r, (n, starts) in enumerate(zip(read, doc_starts)):
        real = min(n, L)
        cuts = sorted({0, *(d for d in starts if d < real)} | ({real} if real < L else set()))
        at_row += [r] * len(cuts)
        at_col += cuts
    rr, cc = np.asarray(at_row, dtype=np.intp), np.asarray(at_col, dtype=np.intp)
    mark = np.zeros((rows, L), dtype=np.int32)
    mark[rr, cc] = 1
    segment = np.cumsum(mark, axis=1, dtype=np.int32) - 1
    out: dict[str, np.ndarray] = {}
    if options.position_ids:
        col = np.arange(L, dtype=np.int64)
        start = np.maximum.accumulate(np.where(mark > 0, col, 0), axis=1)
        out["position_ids"] = col - start
    if options.documents:
        cu = np.full((rows, L + 1), L, dtype=np.int32)
        cu[rr, segment[rr, cc]] = cc
        out["segment_ids"], out["cu_seqlens"] = segment, cu
    return out


def varlen_args(batch: dict[str, Any]) -> tuple[Any, int]:
    """``(cu_seqlens, max_seqlen)`` of a batch flattened to one row of ``B * L`` tokens, as
    ``flash_attn_varlen_func`` takes them: int32 boundaries of every non-empty segment, and
    the longest one. Works on the numpy arrays and on the tensors of a batch."""
    cu = batch["cu_seqlens"]
    rows, width = cu.shape
    L = width - 1
    t = torch.as_tensor(cu).to(torch.int64)
    shifted = t[:, 1:] + torch.arange(rows, device=t.device).unsqueeze(1) * L
    ends = shifted[torch.diff(t, dim=1) > 0]
    flat = torch.cat([torch.zeros(1, dtype=torch.int64, device=t.device), ends])
    max_len = int(torch.diff(flat).max()) if len(flat) > 1 else 0
    return flat.to(torch.int32), max_len
