"""``convert_items``: run ``fn(item) -> sample`` over any items in parallel and write one split.

The samples are written in one place, in the order of the items (or a seeded shuffle of a
sequence), through the same shard stream, lock, report, index and manifest as
:class:`~shardify.convert.pyapi.pywriter.ShardWriter`, so the bytes do not depend on ``workers``.

Resuming: each finished shard leaves a record in the work folder with the positions of the
items it covers, a digest of those items (their pickles) and its keys. Called again with the
same items and options after an interruption (even ``kill -9``), the finished shards are
checked against their records and reused, their items are only hashed (``fn`` is not run for
them), and the output ends byte-identical to an uninterrupted run. This needs items that
can be iterated again in the same order; a changed count or item is detected (the count
through the fingerprint, the items through the digests) and the work is started over. A run
killed after it wrote the manifest is finished by the rerun; a shard written again for a
version the manifest lists must have the listed bytes
(:meth:`~shardify.convert.write.session.ConversionSession.listed_guard`).

Limits per item (``item_timeout``, ``max_worker_memory``): ``fn`` runs in supervised worker
processes that are killed and replaced when an item hangs or a worker outgrows the ceiling;
the item is reported like one whose ``fn`` raised (:mod:`~shardify.convert.pyapi.supervise`).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import pickle
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from shardify.convert.inputs.inputs import Ignored
from shardify.convert.options import parse_size, worker_count
from shardify.convert.pyapi.itemchunks import ChunkRunner, ItemChunk, Outcome, item_repr
from shardify.convert.pyapi.itemmap import map_ordered
from shardify.convert.pyapi.jsonlitems import JsonlItems, load_function
from shardify.convert.pyapi.pywriter import KeyRegistry, WriteOptions, converter_info
from shardify.convert.pyapi.supervise import Limits
from shardify.convert.write.identity import fingerprint
from shardify.convert.write.outfs import WORK_DIR
from shardify.convert.write.plan import shuffle_order
from shardify.convert.write.progressbar import ProgressBar
from shardify.convert.write.session import ConversionSession, SplitSummary
from shardify.convert.write.shardstream import ShardStream
from shardify.convert.write.shardtypes import ShardResult
from shardify.errors import EncodeError, InputError, ShardifyError
from shardify.splitindex import TokenInfo
from shardify.suggest import suggest_keywords

__all__ = ["ItemsOptions", "convert_items", "run_items", "RunSpec", "JsonlItems", "load_function", "FILTERED"]

FILTERED = "filtered"
"""The ``ignored`` reason counted for items whose ``fn`` returned None."""


@suggest_keywords
@dataclass(frozen=True, kw_only=True)
class ItemsOptions(WriteOptions):
    """Options of :func:`convert_items`: those of :class:`WriteOptions` plus how to run ``fn``."""

    shuffle: bool = False
    """Write the items in a seeded shuffle of their order (needs a sequence: ``len`` and indexing)."""
    seed: int = 0
    workers: int = 0
    """Worker processes (0: one per available core; 1: run ``fn`` in this process)."""
    strict: bool = False
    """Stop at the first item whose ``fn`` raises, instead of skipping and reporting it."""
    engine: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    chunk_size: int = 32
    """Items per task sent to a worker; memory holds about ``4 * workers * chunk_size`` samples."""
    progress: bool = True
    item_timeout: float | None = None
    """Seconds ``fn`` may spend on one item; past it the worker is killed and replaced and the
    item reported ("timed out after 5 s"). Runs ``fn`` in worker processes even with ``workers=1``."""
    max_worker_memory: int | str | None = None
    """Bytes (or ``"512MiB"``) a worker's resident memory may grow by; past it the worker is
    killed and replaced, and the item reported ("worker exceeded 512 MiB") when it goes over in
    a fresh worker (see :mod:`~shardify.convert.pyapi.supervise`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_worker_memory is not None:
            object.__setattr__(self, "max_worker_memory", parse_size(self.max_worker_memory))
        if self.item_timeout is not None and not self.item_timeout > 0:
            raise ValueError(f"item_timeout={self.item_timeout} should be > 0 seconds (or None: no limit)")
        if (self.item_timeout is not None or self.max_worker_memory is not None) and sys.platform != "linux":
            raise ValueError(f"item_timeout and max_worker_memory need Linux (fork and /proc), not {sys.platform}")
        if self.workers < 0:
            raise ValueError(f"workers={self.workers} should be >= 0 (0: one per core)")
        if self.engine not in ("local", "ray"):
            raise ValueError(f"engine={self.engine!r} should be 'local' or 'ray'")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size={self.chunk_size} should be >= 1")

    @property
    def num_workers(self) -> int:
        """Worker processes to use: ``workers``, or one per available core when 0."""
        return worker_count(self.workers)

    def shaping(self) -> dict[str, Any]:
        limits = {
            name: value
            for name, value in (("item_timeout", self.item_timeout), ("max_worker_memory", self.max_worker_memory))
            if value is not None
        }
        return {**super().shaping(), "shuffle": self.shuffle, "seed": self.seed, **limits}

    @property
    def limits(self) -> Limits | None:
        """The limits per item for the worker processes, or None when none is set."""
        if self.item_timeout is None and self.max_worker_memory is None:
            return None
        return Limits(item_timeout=self.item_timeout, max_memory=self.max_worker_memory)  # type: ignore[arg-type]


def convert_items(
    items: Iterable[Any],
    fn: Callable[[Any], Mapping[str, object] | None],
    out: str | os.PathLike[str],
    *,
    options: ItemsOptions | None = None,
    **overrides: Any,
) -> SplitSummary:
    """Write ``fn(item)`` for every item into split ``split`` of ``out``; return the summary.

    ``fn`` returns a sample dict (see :mod:`shardify.convert.pyapi.values`) or None to filter the
    item out. An item whose ``fn`` raises is skipped and listed in ``{split}.report.jsonl``
    (``strict=True``: raised). Options are :class:`ItemsOptions` fields, as keywords or
    ``options=``. Resumable (see the module docstring).
    """
    o = replace(options or ItemsOptions(), **overrides)
    if o.shuffle and not isinstance(items, Sequence):
        raise ValueError(
            f"shuffle=True needs a sequence (len and indexing), found {type(items).__name__}; "
            "pass a list or keep the input order"
        )
    fp = _fingerprint(o, fn, len(items) if isinstance(items, Sized) else None)
    spec = RunSpec(runner=ChunkRunner(fn, o.values, o.classes), source=f"python:{_fn_name(fn)}")
    return run_items(items, spec, out, o, fp)


@dataclass(frozen=True)
class RunSpec:
    """What a way into :func:`run_items` brings: the runner that makes each chunk's samples,
    the converter name for the index, and how reports name an input and its error."""

    runner: ChunkRunner
    source: str
    """The index's ``converter.source`` (``python:module:fn``)."""
    noun: str = "item"
    reason: str = "fn raised "
    """Put before an outcome's error in the report."""
    tokens: TokenInfo | None = None
    """A token split: each shard's document lengths (:attr:`Outcome.tokens`) go into the index."""
    index_keys: bool = False
    """Every key is its item's index (``{index:09d}``), unique: not kept to refuse duplicates."""


def run_items(
    items: Iterable[Any], spec: RunSpec, out: str | os.PathLike[str], o: ItemsOptions, fp: str
) -> SplitSummary:
    """Map ``spec.runner`` over ``items`` into split ``o.split`` of ``out`` (fingerprint ``fp``):
    the one path of :func:`convert_items` and :func:`~shardify.convert.pyapi.tokens.convert_tokens`."""
    session = ConversionSession.open(out, {o.split: fp}, overwrite=o.overwrite, storage_options=o.storage_options)
    with session.holding():
        return _Run(items, spec, session, o).run(fp)


def _fn_name(fn: Callable[..., Any]) -> str:
    target = getattr(fn, "func", fn)  # functools.partial
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', type(target).__qualname__)}"


def _fingerprint(o: ItemsOptions, fn: Callable[..., Any], count: int | None) -> str:
    """Equal fingerprints: the same items give the same output (fn's own bytecode included)."""
    code = getattr(getattr(fn, "func", fn), "__code__", None)
    h = fingerprint(options=o.shaping(), classes=list(o.classes), fn=_fn_name(fn), count=count)
    if code is not None:
        h.update(code.co_code)
    return str(h.hexdigest())


def _hash_item(h: Any, item: object) -> None:
    """Feed one item to a shard's digest, for detecting changed input on resume (pickle, else repr)."""
    try:
        data = pickle.dumps(item, protocol=4)
    except Exception:  # noqa: BLE001 - unpicklable items are still hashed, by repr
        data = repr(item).encode("utf-8", "replace")
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)


@dataclass
class _Open:
    """What the shard being written covers, for its record."""

    start: int
    hash: Any = field(default_factory=hashlib.sha256)
    keys: list[str] = field(default_factory=list)
    indexes: list[int] = field(default_factory=list)
    filtered: int = 0
    tokens: list[int] = field(default_factory=list)


class _Run:
    """One call of :func:`convert_items` on a locked output."""

    def __init__(self, items: Iterable[Any], spec: RunSpec, session: ConversionSession, o: ItemsOptions) -> None:
        self.items, self.spec, self.session, self.o = items, spec, session, o
        self.count = len(items) if isinstance(items, Sized) else None
        self.results: list[ShardResult] = []
        self.keys = KeyRegistry(spec.noun)
        self.pos = 0
        self._end = 0
        self.open = _Open(start=0)
        self._filtered_counts: list[int] = []

    def run(self, fp: str) -> SplitSummary:
        o, session = self.o, self.session
        version = session.begin(o.split, fp, kind="items")
        reused = self._load_records()
        source = self._positions()
        self._check_prefix(source, reused)
        resume_at = reused[-1]["stop"] if reused else 0
        self.pos = resume_at
        self.open = _Open(start=resume_at)
        stream = session.stream(
            o.split,
            version,
            shard_size=o.size_bound,
            samples_per_shard=o.samples_per_shard,
            fsync=o.fsync,
            chunk=o.chunk,
            first=len(reused),
            on_shard=self._finished,
        )
        bar = ProgressBar(
            total=self.count,
            desc=o.split,
            enabled=o.progress,
            done=resume_at,
            done_bytes=sum(r.filesize for r in self.results),
        )
        runner = self.spec.runner
        chunks = self._chunks(source)
        try:
            for chunk, out in map_ordered(
                runner, chunks, workers=o.num_workers, engine=o.engine, ray_address=o.ray_address, limits=o.limits
            ):
                nbytes = self._take_chunk(stream, chunk, out.outcomes, out.data)
                stream.flush()
                bar.set(chunk.start + len(out.outcomes), bar.nbytes + nbytes)
            self.pos = self._end
            session.end_stream(o.split, stream)
        except BaseException:
            stream.abort()
            raise
        finally:
            bar.close()
        skipped = [p for r in self.results for p in r.skipped] + stream.skipped
        filtered = sum(self._filtered_counts) + self.open.filtered
        index = session.finish(
            o.split,
            self.results,
            classes=o.classes,
            skipped=skipped,
            ignored=[],
            ignored_counts={FILTERED: filtered} if filtered else None,
            converter=converter_info(self.spec.source, o.shaping()),
            version=stream.version,
            durable=o.fsync,
            chunk=o.chunk,
            tokens=self.spec.tokens,
        )
        session.publish()
        return session.summary(index, skipped, reused=len(reused))

    # -- the order of the items ------------------------------------------------------------
    def _positions(self) -> Iterator[tuple[int, int, Any]]:
        """``(position, input index, item)`` in the processing order; counts :attr:`_end`."""
        self._end = 0
        if self.o.shuffle:
            items: Sequence[Any] = self.items  # type: ignore[assignment]
            for p, i in enumerate(shuffle_order(len(items), seed=self.o.seed, split=self.o.split)):
                self._end = p + 1
                yield p, i, items[i]
        else:
            for p, item in enumerate(self.items):
                self._end = p + 1
                yield p, p, item

    def _chunks(self, source: Iterator[tuple[int, int, Any]]) -> Iterator[ItemChunk]:
        while batch := list(itertools.islice(source, self.o.chunk_size)):
            positions, indexes, items = zip(*batch)  # the columns of the batch, in one C call
            yield ItemChunk(start=positions[0], indexes=indexes, items=items)

    # -- the outcomes ----------------------------------------------------------------------
    def _take_chunk(
        self, stream: ShardStream, chunk: ItemChunk, outcomes: list[Outcome], data: bytes | memoryview
    ) -> int:
        """Write (here), skip or count (:meth:`_take`) a chunk's outcomes; return the bytes they took."""
        unframed, keys, offset = self.spec.runner.unframed, None if self.spec.index_keys else self.keys, 0
        for j, got in enumerate(outcomes):
            self.pos = chunk.start + j
            key = got.key
            if key is None or got.encode_error is not None:
                self._take(stream, chunk, j, got)
                continue
            index, end = chunk.indexes[j], offset + got.size
            if keys is not None:
                keys.add(key, index)
            if unframed is None:
                stream.add_encoded(got.fields, data, offset, end)  # may finish the shard before pos
            else:
                stream.add_field(key, unframed, bytes(data[offset:end]))  # a copy: the slot is reused
            offset = end
            held = self.open
            held.keys.append(key)
            held.indexes.append(index)
            held.tokens.append(got.tokens)
            _hash_item(held.hash, chunk.items[j])
        return offset

    def _take(self, stream: ShardStream, chunk: ItemChunk, j: int, got: Outcome) -> None:
        """Skip or count one outcome that is not a sample (or raise its encoding error)."""
        index, item = chunk.indexes[j], chunk.items[j]
        if got.encode_error is not None:
            raise EncodeError(f"item {index} ({item_repr(item)}): {got.encode_error}")
        if got.error is not None or got.stopped is not None:
            reason = got.stopped or f"{self.spec.reason}{got.error}"
            noun = self.spec.noun
            if self.o.strict:
                raise InputError(reason, path=f"{noun} {index} ({item_repr(item)})")
            stream.skip(Ignored(f"{noun} {index}: {item_repr(item)}", reason))
        else:
            self.open.filtered += 1
        _hash_item(self.open.hash, item)

    # -- records: resuming -----------------------------------------------------------------
    def _finished(self, result: ShardResult) -> None:
        """A shard was renamed into place: record what it covers (positions start..pos-1)."""
        o = self.open
        stop = self.pos
        if self.spec.tokens is not None:
            result = replace(result, tokens=np.asarray(o.tokens, dtype="<u4").tobytes())
        self.session.record(
            self.o.split,
            result,
            start=o.start,
            stop=stop,
            digest=o.hash.hexdigest(),
            keys=o.keys,
            indexes=o.indexes,
            filtered=o.filtered,
        )
        self.results.append(result)
        self._filtered_counts.append(o.filtered)
        self.open = _Open(start=stop)

    def _load_records(self) -> list[dict[str, Any]]:
        """Records of the finished shards of an earlier run of the same call, from shard 0 on."""
        records: list[dict[str, Any]] = []
        while (found := self.session.reusable(self.o.split, len(records))) is not None:
            result, r = found
            try:
                if r["start"] != (records[-1]["stop"] if records else 0):
                    break
                for key, index in zip(r["keys"], r["indexes"], strict=True):
                    if not self.spec.index_keys:
                        self.keys.add(key, index)
                filtered = int(r["filtered"])
            except (ShardifyError, KeyError, TypeError, ValueError):
                break
            records.append(r)
            self.results.append(result)
            self._filtered_counts.append(filtered)
        return records

    def _check_prefix(self, source: Iterator[tuple[int, int, Any]], records: list[dict[str, Any]]) -> None:
        """Hash the items the reused shards cover; a difference means the input changed."""
        for r in records:
            h = hashlib.sha256()
            for _ in range(r["start"], r["stop"]):
                got = next(source, None)
                if got is None:
                    break
                _hash_item(h, got[2])
            if h.hexdigest() != r["digest"]:
                self.session.fs.remove_tree(f"{WORK_DIR}/{self.o.split}")
                raise InputError(
                    f"the items at positions {r['start']}..{r['stop'] - 1} differ from those of the interrupted "
                    "run this output was resuming (items must be iterable again in the same order); "
                    "its work records were removed: run again to start over",
                    path=str(self.session.fs.location),
                )
