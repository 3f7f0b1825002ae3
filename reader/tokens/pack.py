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

__all__ = ["PackOptions", "RowBuffers", "varlen_args"]


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


class RowBuffers:
    """The arrays of one batch of ``rows`` x ``seq_len``, filled row by row."""

    def __init__(self, rows: int, seq_len: int, options: PackOptions) -> None:
        self.seq_len, self.options = seq_len, options
        self.input_ids = np.empty((rows, seq_len), dtype=np.int64)  # every row filled or padded
        self.labels = np.empty((rows, seq_len), dtype=np.int64)
        self.num_tokens = np.zeros(rows, dtype=np.int64)
        self.position_ids = np.tile(np.arange(seq_len, dtype=np.int64), (rows, 1)) if options.position_ids else None
        if options.documents:
            self.segment_ids: np.ndarray | None = np.zeros((rows, seq_len), dtype=np.int32)
            self.cu_seqlens: np.ndarray | None = np.full((rows, seq_len + 1), seq_len, dtype=np.int32)
            self.cu_seqlens[:, 0] = 0
        else:
            self.segment_ids = self.cu_seqlens = None

    def fill(self, row: int, tokens: np.ndarray, doc_starts: list[int]) -> None:
        """Row ``row`` from ``tokens`` (its inputs and the next token, when there is one) and
        where documents begin in them."""
        L = self.seq_len
        read = len(tokens)
        real = min(read, L)
        self.input_ids[row, :real] = tokens[:real]
        self.input_ids[row, real:] = self.options.pad_id
        self.labels[row, : read - 1] = tokens[1:read]
        self.labels[row, read - 1 :] = self.options.ignore_index
        self.num_tokens[row] = real
        if self.position_ids is None and self.segment_ids is None:
            return
        cuts = sorted({0, *(d for d in doc_starts if d < real)} | ({real} if real < L else set()))
        starts = np.asarray(cuts, dtype=np.int64)
        if self.position_ids is not None and len(cuts) > 1:
            seg = np.repeat(np.arange(len(cuts)), np.diff(np.append(starts, L)))
            self.position_ids[row] -= starts[seg]
        if self.segment_ids is not None and self.cu_seqlens is not None:
            self.segment_ids[row] = np.repeat(np.arange(len(cuts), dtype=np.int32), np.diff(np.append(starts, L)))
            self.cu_seqlens[row, : len(cuts)] = starts

    def pad(self, row: int) -> None:
        """Row ``row`` as a padding row: no real token, every label ignored."""
        self.input_ids[row] = self.options.pad_id
        self.labels[row] = self.options.ignore_index

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"input_ids": self.input_ids, "labels": self.labels, "num_tokens": self.num_tokens}
        if self.position_ids is not None:
            out["position_ids"] = self.position_ids
        if self.segment_ids is not None and self.cu_seqlens is not None:
            out["segment_ids"], out["cu_seqlens"] = self.segment_ids, self.cu_seqlens
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
