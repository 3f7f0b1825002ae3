"""The one shard writer: samples, in the order given, into the numbered shards of one split.

Every shard shardify makes is written here: the planned shards of ``shardify convert``
(:func:`~shardify.convert.write.shards.write_shard` feeds one plan's samples to one shard),
:class:`~shardify.convert.pyapi.pywriter.ShardWriter` and
:func:`~shardify.convert.pyapi.fromitems.convert_items` (which cut a shard when the next sample would
not fit: ``shard_size`` bytes and/or ``samples_per_shard``, the rule
:func:`~shardify.convert.write.plan.plan_split` packs by, so the same samples in the same order
give the same shards). Each shard is written through
:class:`~shardify.convert.write.tarwrite.HashingWriter` (SHA-256, size and per-sample table
as the bytes go) under its temporary name, and renamed when whole.

With ``chunk=N`` (the chunked layout, :mod:`shardify.chunk`) samples are held until ``N`` of
them make a chunk, which is written as one tar sample. Shards are cut where the per-sample
layout would cut them (``shard_size`` counts each sample's per-sample bytes), so a chunked
shard holds the same samples, in fewer bytes, and the shard ends a chunk early (its last
chunk may be short); its ``offsets`` list the byte offset of chunks 0, OFFSET_STRIDE, ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import BinaryIO

from shardify.convert.inputs.inputs import Ignored
from shardify.convert.write.outfs import OutputFS
from shardify.convert.write.shardtypes import ShardResult
from shardify.convert.write.tarwrite import HashingWriter, split_members, temp_name, write_chunk, write_members
from shardify.errors import OutputError
from shardify.tarfmt import BLOCK, END_OF_ARCHIVE, OFFSET_STRIDE, shard_name

__all__ = ["ShardStream", "sample_size"]


def sample_size(members: list[tuple[str, bytes]]) -> int:
    """Bytes the members of one sample take in a shard, headers and padding included
    (:func:`~shardify.tarfmt.member_size` of each, inlined: called per sample)."""
    size = 0
    for _, data in members:
        size += BLOCK + (len(data) + BLOCK - 1) // BLOCK * BLOCK
    return size


class ShardStream:
    """Numbered shards of ``split`` in ``fs``, from shard ``first`` on; not thread-safe.

    ``on_shard`` is called with each finished shard's result, after its rename, so the caller
    can record it for resuming.
    """

    def __init__(
        self,
        fs: OutputFS,
        split: str,
        *,
        shard_size: int | None,
        samples_per_shard: int | None,
        fsync: bool,
        first: int = 0,
        on_shard: Callable[[ShardResult], None] | None = None,
        version: str | None = None,
        chunk: int | None = None,
        before_rename: Callable[[int, int, str], None] | None = None,
    ) -> None:
        self.fs = fs
        self.chunk = chunk
        """Samples per chunk (None: the per-sample layout)."""
        self._pending: list[tuple[str, list[tuple[str, bytes]]]] = []
        """Samples of the chunk being gathered (chunked layout only)."""
        self._chunks = 0
        """Chunks in the open shard."""
        self.before_rename = before_rename
        """Called with ``(index, size, sha256)`` of each whole shard before its rename; raising
        drops the shard (a guard: see :meth:`~shardify.convert.write.session.ConversionSession.listed_guard`)."""
        self.split = split
        self.version = version
        """The version token in the shards' names (:mod:`shardify.convert.write.versions`)."""
        self.shard_size = shard_size
        self.samples_per_shard = samples_per_shard
        self.fsync = fsync
        self.index = first
        self.on_shard = on_shard
        self.samples = 0
        """Samples in the open shard."""
        self.nbytes = len(END_OF_ARCHIVE)
        """Bytes the open shard will have once closed."""
        self.fields: set[str] = set()
        self.skipped: list[Ignored] = []
        self.notes: list[Ignored] = []
        """Inputs packed with decoder warnings since the open shard started (reported with it)."""
        self.offsets: list[int] = []
        """Offsets of the open shard's samples 0, OFFSET_STRIDE, ..."""
        self._file: BinaryIO | None = None
        self._out: HashingWriter | None = None
        self._held: tuple[bytes | memoryview, int, int] | None = None
        """``(data, start, end)``: encoded samples added but not yet written (see :meth:`add_encoded`)."""

    @property
    def written(self) -> int:
        """Bytes written to the open shard so far (0 when none is open)."""
        return 0 if self._out is None else self._out.size

    def open_shard(self) -> None:
        """Open the next shard now, so that it is written even if no sample gets into it (a
        planned shard whose every input was skipped is still one of the plan's shards)."""
        if self._out is None:
            self._open()

    def fits(self, size: int) -> bool:
        """Whether a sample of ``size`` bytes goes into the open shard (an empty shard takes any)."""
        if self.samples == 0:
            return True
        if self.samples_per_shard is not None and self.samples >= self.samples_per_shard:
            return False
        return self.shard_size is None or self.nbytes + size <= self.shard_size

    def add(self, key: str, members: list[tuple[str, bytes]], size: int | None = None) -> None:
        """Append one sample; cuts a shard first if full. ``size`` is :func:`sample_size` of
        ``members`` when the caller has it; else it is computed here, only when a size bound or
        the chunked layout needs it (a planned shard has neither: its plan cut it)."""
        if self.chunk is not None:
            self._gather(key, members, sample_size(members) if size is None else size)
            return
        if self.samples and (self.shard_size is not None or self.samples_per_shard is not None):
            if not self.fits(sample_size(members) if size is None else size):
                self.close_shard()
        if self._held is not None:
            self.flush()
        out = self._out or self._open()
        at = self.nbytes - len(END_OF_ARCHIVE)
        if self.samples % OFFSET_STRIDE == 0:  # an offset the index lists (called per sample: inlined)
            self.offsets.append(at)
        out.mark(at)
        try:
            written = write_members(out, key, members)
        except OSError as e:
            self.abort()
            raise OutputError(f"{self.fs.location}/{self._name()}: cannot write shard: {e.strerror or e}") from e
        self.samples += 1
        self.nbytes += written
        fields = self.fields
        for ext, _ in members:  # a loop, not update(genexpr): called per sample
            if ext not in fields:
                fields.add(ext)

    def add_encoded(self, fields: tuple[str, ...], data: bytes | memoryview, start: int, end: int) -> None:
        """Append one sample already encoded as tar members (``data[start:end]``, see ``member_parts``).

        Cuts a shard first if full. Consecutive slices of one ``data`` go out in one write
        (no copy); :meth:`flush` writes what is held, and closing a shard flushes first.
        """
        size = end - start
        if self.chunk is not None:
            key, members = split_members(data, start, end)
            self._gather(key, members, size)
            return
        if not self.fits(size):
            self.close_shard()
        out = self._out or self._open()
        self._note_offset()
        out.mark(self.nbytes - len(END_OF_ARCHIVE))
        held = self._held
        if held is not None and held[0] is data and held[2] == start:
            self._held = (data, held[1], end)
        else:
            self.flush()
            self._held = (data, start, end)
        self.samples += 1
        self.nbytes += size
        self.fields.update(fields)

    def add_field(self, key: str, ext: str, data: bytes) -> None:
        """Append one sample of one field, chunked layout only (the bytes
        :meth:`add_encoded` would take, without their tar header and padding, and a key
        already checked). Cuts a shard first if full, as the per-sample layout would."""
        if self.chunk is None:
            raise ValueError(f"add_field is for a chunked split; {self.split!r} is per sample (chunk=None)")
        size = BLOCK + (len(data) + BLOCK - 1) // BLOCK * BLOCK
        if self.samples and not self.fits(size):  # _gather, inlined: called per sample
            self.close_shard()
        pending = self._pending
        pending.append((key, [(ext, data)]))
        self.samples += 1
        self.nbytes += size
        if len(pending) == self.chunk:
            self._write_chunk()

    def _gather(self, key: str, members: list[tuple[str, bytes]], size: int) -> None:
        """Hold one sample for the chunk being gathered (the shard was cut before it as the
        per-sample layout would be); write the chunk once it holds ``chunk`` samples."""
        if not self.fits(size):
            self.close_shard()
        self._pending.append((key, members))
        self.samples += 1
        self.nbytes += size
        if len(self._pending) == self.chunk:
            self._write_chunk()

    def _write_chunk(self) -> None:
        """Write the gathered samples as one chunk (one tar sample, keyed by its first sample)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        out = self._out or self._open()
        if self._chunks % OFFSET_STRIDE == 0:
            self.offsets.append(out.size)
        try:
            write_chunk(out, pending)
        except OSError as e:
            self.abort()
            raise OutputError(f"{self.fs.location}/{self._name()}: cannot write shard: {e.strerror or e}") from e
        self._chunks += 1
        self.fields.update(ext for _, m in pending for ext, _ in m)

    def flush(self) -> None:
        """Write the encoded samples :meth:`add_encoded` holds, if any."""
        held, self._held = self._held, None
        if held is None or self._out is None:
            return
        data, start, end = held
        try:
            self._out.write(memoryview(data)[start:end])
        except OSError as e:
            self.abort()
            raise OutputError(f"{self.fs.location}/{self._name()}: cannot write shard: {e.strerror or e}") from e

    def _note_offset(self) -> None:
        """Before a sample is added: keep its offset if it is one the index lists."""
        if self.samples % OFFSET_STRIDE == 0:
            self.offsets.append(self.nbytes - len(END_OF_ARCHIVE))

    def skip(self, problem: Ignored) -> None:
        """Note an input that was not packed; it is reported with the shard being written."""
        self.skipped.append(problem)

    def _name(self) -> str:
        return shard_name(self.split, self.index, self.version)

    def _open(self) -> HashingWriter:
        try:
            self._file = self.fs.open_write(temp_name(self._name()), durable=self.fsync)
        except OSError as e:
            raise OutputError(
                f"{self.fs.location}/{temp_name(self._name())}: cannot create shard: {e.strerror or e}"
            ) from e
        self._out = HashingWriter(self._file)
        return self._out

    def close_shard(self) -> ShardResult | None:
        """Finish the open shard (if it holds samples) and call ``on_shard``; None if empty.

        Problems noted since the last sample stay in :attr:`skipped` when no shard is open.
        """
        self._write_chunk()
        self.flush()
        out, f = self._out, self._file
        if out is None or f is None:
            return None
        final = self._name()
        tmp = temp_name(self._name())
        try:
            out.mark(out.size)
            out.write(END_OF_ARCHIVE)
            self.fs.finish_write(f, fsync=self.fsync)
            f.close()
            if self.before_rename is not None:
                self.before_rename(self.index, out.size, out.hash.hexdigest())
            self.fs.replace(tmp, final)
        except OSError as e:
            self.abort()
            raise OutputError(f"{self.fs.location}/{final}: cannot write shard: {e.strerror or e}") from e
        except BaseException:
            self.abort()
            raise
        result = ShardResult(
            index=self.index,
            url=final,
            nsamples=self.samples,
            filesize=out.size,
            sha256=out.hash.hexdigest(),
            fields=tuple(sorted(self.fields)),
            skipped=tuple(self.skipped),
            notes=tuple(self.notes),
            offsets=tuple(self.offsets),
            samples=out.table.table(self.samples) if self.chunk is None else b"",
        )
        self._file = self._out = None
        self.index += 1
        self.samples, self.nbytes, self.fields, self.skipped, self.notes = 0, len(END_OF_ARCHIVE), set(), [], []
        self.offsets, self._chunks = [], 0
        if self.on_shard is not None:
            self.on_shard(result)
        return result

    def abort(self) -> None:
        """Close and delete the open shard's temporary file; finished shards stay."""
        f, self._file, self._out, self._held = self._file, None, None, None
        self._pending = []
        if f is not None:
            try:
                f.close()
            except OSError:
                pass
            try:
                self.fs.remove(temp_name(self._name()))
            except OSError:
                pass
