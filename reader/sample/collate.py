"""Turn a list of samples into one batch, inside the workers; and length bucketing.

``default_collate`` stacks each field into one preallocated tensor. These functions are pure:
a list of samples in, tensors out, each allocated by the ``empty`` they are given (private
memory by default). Moving a batch to the main process is the ToSharedMemory stage's job
(:mod:`shardify.reader.stages.sharedmem`); given the worker pool's allocator
(:func:`with_allocator`), the batch is made in shared memory and travels without a copy. ``pad_collate`` pads
variable-size fields and returns lengths and a mask.
``bucket_batches`` groups samples of similar length to cut the padding.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

__all__ = ["Empty", "private_empty", "default_collate", "pad_collate", "with_allocator", "bucket_batches"]

S = TypeVar("S")

_NUMERIC_KINDS = frozenset("biufc")


Empty = Callable[[Sequence[int], torch.dtype], torch.Tensor]
"""``empty(shape, dtype)``: an uninitialised CPU tensor, where a collate function puts a batch tensor."""


def private_empty(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """The default allocator: ``torch.empty`` (private memory)."""
    return torch.empty(tuple(shape), dtype=dtype)


def with_allocator(collate_fn: Callable[[list[Any]], Any], empty: Empty) -> Callable[[list[Any]], Any]:
    """``collate_fn`` drawing its batch tensors from ``empty`` if it is one of this module's collates
    (or a ``functools.partial`` of one), else ``collate_fn`` itself (it allocates for itself)."""
    base = collate_fn.func if isinstance(collate_fn, functools.partial) else collate_fn
    if base is default_collate or base is pad_collate:
        return functools.partial(collate_fn, empty=empty)  # type: ignore[call-arg]
    return collate_fn


def _as_tensor(value: torch.Tensor | np.ndarray) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))


def _is_array(value: object) -> bool:
    """A tensor, or a numpy array of numbers/bools (object and string arrays are not)."""
    return isinstance(value, torch.Tensor) or (isinstance(value, np.ndarray) and value.dtype.kind in _NUMERIC_KINDS)


def _stack(values: list[Any], where: str, empty: Empty) -> torch.Tensor:
    """Stack equal-shape tensors/arrays into one preallocated tensor, one copy per sample."""
    tensors = [_as_tensor(v) for v in values]
    first = tensors[0]
    dtype = first.dtype
    for i, t in enumerate(tensors):
        if t.shape != first.shape:
            raise ValueError(
                f"{where}: cannot stack shapes {tuple(first.shape)} (sample 0) and {tuple(t.shape)} "
                f"(sample {i}). Images of different sizes need a transform that gives them one size: "
                f"transform=transforms.imagenet_eval(224) (resize and center crop) or imagenet_train(224) "
                f"(from shardify.reader); for other variable-size fields use pad_collate"
            )
        if t.dtype != dtype:
            dtype = torch.promote_types(dtype, t.dtype)
    if first.device.type != "cpu":
        return torch.stack(tensors).to(dtype)
    out = empty((len(tensors), *first.shape), dtype)
    return torch.stack(tensors, out=out)


def _padded_dims(ndim: int) -> tuple[int, ...]:
    """1-D [T] and 2-D [T, D] pad dim 0; [C, H, W] (and more) pad every dim but the first."""
    return (0,) if ndim <= 2 else tuple(range(1, ndim))


def _pad(values: list[Any], where: str, pad_value: float, multiple_of: int | None, empty: Empty) -> tuple[object, ...]:
    """(padded, lengths, mask) for tensors that may differ in their padded dims."""
    tensors = [_as_tensor(v) for v in values]
    first = tensors[0]
    dims = _padded_dims(first.ndim)
    dtype = first.dtype
    for i, t in enumerate(tensors):
        fixed_ok = t.ndim == first.ndim and all(t.shape[d] == first.shape[d] for d in range(t.ndim) if d not in dims)
        if not fixed_ok:
            raise ValueError(
                f"{where}: cannot pad shape {tuple(t.shape)} (sample {i}) to {tuple(first.shape)} "
                f"(sample 0): only dims {dims} may differ"
            )
        dtype = torch.promote_types(dtype, t.dtype)
    shape = list(first.shape)
    for d in dims:
        longest = max(t.shape[d] for t in tensors)
        shape[d] = -(-longest // multiple_of) * multiple_of if multiple_of else longest
    padded = empty((len(tensors), *shape), dtype).fill_(pad_value)
    mask = empty((len(tensors), *(shape[d] for d in dims)), torch.bool).zero_()
    lengths = torch.tensor([[t.shape[d] for d in dims] for t in tensors], dtype=torch.int64)
    for i, t in enumerate(tensors):
        padded[i][tuple(slice(0, n) for n in t.shape)] = t
        mask[i][tuple(slice(0, t.shape[d]) for d in dims)] = True
    return padded, (lengths[:, 0] if len(dims) == 1 else lengths), mask


def _collate(
    batch: list[Any],
    where: str,
    leaf: Callable[[list[Any], str], object],
    pad_here: Callable[[str], bool],
    empty: Empty,
) -> object:
    elem = batch[0]
    if _is_array(elem):
        if not all(_is_array(v) for v in batch):
            raise ValueError(f"{where}: sample 0 holds an array but not every sample does")
        if pad_here(where) and _as_tensor(elem).ndim >= 1:
            return leaf(batch, where)
        return _stack(batch, where, empty)
    if isinstance(elem, Mapping):
        keys = list(elem)
        for i, s in enumerate(batch):
            if not isinstance(s, Mapping) or s.keys() != elem.keys():
                raise ValueError(f"{where}: sample {i} has keys {sorted(s)}, sample 0 has {sorted(keys)}")
        return {k: _collate([s[k] for s in batch], f"{where}[{k!r}]", leaf, pad_here, empty) for k in keys}
    if isinstance(elem, (tuple, list)):
        for i, s in enumerate(batch):
            if not isinstance(s, (tuple, list)) or len(s) != len(elem):
                raise ValueError(f"{where}: sample {i} has {len(s)} items, sample 0 has {len(elem)}")
        columns = [_collate(list(col), f"{where}[{j}]", leaf, pad_here, empty) for j, col in enumerate(zip(*batch))]
        if hasattr(elem, "_fields"):  # a NamedTuple: its fields by position
            named: Callable[..., Any] = type(elem)
            return named(*columns)
        return tuple(columns)
    if all(isinstance(v, (bool, np.bool_)) for v in batch):
        return torch.tensor([bool(v) for v in batch], dtype=torch.bool)
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in batch):
        return torch.tensor([int(v) for v in batch], dtype=torch.int64)
    if all(isinstance(v, (int, float, np.integer, np.floating)) for v in batch):
        return torch.tensor([float(v) for v in batch], dtype=torch.get_default_dtype())
    return list(batch)


def _check_batch(samples: list[Any]) -> None:
    if not isinstance(samples, Sequence) or len(samples) == 0:
        raise ValueError(f"samples should be a non-empty list, got {samples!r:.80}")


def default_collate(samples: list[Any], *, empty: Empty = private_empty) -> object:
    """Batch samples field by field: one tensor per array field, tuples and dicts kept.

    Tensors and numeric numpy arrays of equal shape -> one ``[B, ...]`` tensor (dtypes
    promoted); Python ints -> int64; floats (or ints mixed with floats) -> the default float
    dtype (float32, where torch's collate gives float64); bools -> bool; tuples/lists -> a tuple
    of columns (a namedtuple stays one); dicts -> a dict; anything else (str, bytes, None,
    PIL images) -> a list. Unequal shapes raise ValueError naming the field. ``empty(shape,
    dtype)`` allocates each batch tensor (default: private memory; the worker's shared-memory
    slots under ``make_loader``, see :func:`with_allocator`).
    """
    _check_batch(samples)
    return _collate(list(samples), "batch", lambda b, w: _stack(b, w, empty), lambda w: False, empty)


def pad_collate(
    samples: list[Any],
    *,
    pad_value: float = 0,
    multiple_of: int | None = None,
    fields: Collection[str | int] | None = None,
    empty: Empty = private_empty,
) -> object:
    """Like ``default_collate``, but array fields of 1 dim or more come back padded.

    For each such field: ``(padded, lengths, mask)``, whatever the shapes in this batch (so the
    structure never changes from batch to batch):

    - 1-D ``[T]`` -> padded ``[B, T_max]``, lengths int64 ``[B]``, mask bool ``[B, T_max]``;
    - 2-D ``[T, D]`` -> padded ``[B, T_max, D]``, lengths ``[B]``, mask ``[B, T_max]``;
    - 3-D ``[C, H, W]`` -> padded ``[B, C, H_max, W_max]``, lengths ``[B, 2]`` of (H, W), mask
      ``[B, H_max, W_max]`` (more dims: every dim but the first is padded, lengths ``[B, ndim-1]``).

    Data sits at the start (top-left) of each padded dim; the mask is True there. ``pad_value``
    (cast to the field's dtype) fills the rest. Each padded size is the batch maximum, rounded
    up to ``multiple_of`` if given. ``fields`` limits padding to those top-level dict keys or
    tuple positions (the rest is stacked as ``default_collate`` does); None pads every array
    field of 1 dim or more. 0-d arrays and scalars are stacked. ``empty``: as for ``default_collate``.
    """
    _check_batch(samples)
    if multiple_of is not None and (not isinstance(multiple_of, int) or multiple_of <= 0):
        raise ValueError(f"{multiple_of=} should be a positive int or None")
    tops = None if fields is None else {f"batch[{f!r}]" for f in fields}

    def pad_here(where: str) -> bool:
        return tops is None or any(where == t or where.startswith(t + "[") for t in tops)

    def leaf(batch: list[Any], where: str) -> object:
        return _pad(batch, where, pad_value, multiple_of, empty)

    return _collate(list(samples), "batch", leaf, pad_here, empty)


def bucket_batches(
    samples: Iterable[S],
    *,
    batch_size: int,
    length: Callable[[S], int],
    buffer_size: int,
    rng: random.Random,
    drop_last: bool,
) -> Iterator[list[S]]:
    """Group samples of similar ``length`` into batches to cut padding; each sample once.

    Fills a buffer of ``buffer_size`` samples, sorts it by length (stable), cuts it into full
    batches and yields them in an ``rng`` order; the few left over (at a random place in the
    sorted order) join the next buffer. At the end the last partial batch comes last, unless
    ``drop_last``. Memory: ``buffer_size`` samples.
    """
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"{batch_size=} should be a positive int")
    if not isinstance(buffer_size, int) or buffer_size < batch_size:
        raise ValueError(f"{buffer_size=} should be an int >= {batch_size=}")
    buffer: list[S] = []
    for sample in samples:
        buffer.append(sample)
        if len(buffer) >= buffer_size:
            buffer.sort(key=length)
            full, rest = divmod(len(buffer), batch_size)
            cut = rng.randint(0, full) * batch_size  # the leftover starts here
            kept = buffer[:cut] + buffer[cut + rest :]
            batches = [kept[i : i + batch_size] for i in range(0, len(kept), batch_size)]
            buffer = buffer[cut : cut + rest]
            rng.shuffle(batches)
            yield from batches
    buffer.sort(key=length)
    batches = [buffer[i : i + batch_size] for i in range(0, len(buffer), batch_size)]
    partial = batches.pop() if batches and len(batches[-1]) < batch_size else None
    rng.shuffle(batches)
    yield from batches
    if partial is not None and not drop_last:
        yield partial
