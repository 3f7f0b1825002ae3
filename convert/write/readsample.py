"""Read one planned sample's input files into its tar members: each file checked (an image's
format, size and completeness; decoded with ``--check full``) and maybe transcoded.

Runs in the worker processes that write planned shards
(:func:`~shardify.convert.write.shards.write_shard`); an input that cannot be packed raises
:class:`~shardify.errors.InputError` naming the file and the sample's key.
"""

from __future__ import annotations

import os

from shardify.convert.inputs.capture import decoder_messages
from shardify.convert.inputs.imageformat import reencode
from shardify.convert.inputs.inputs import Ignored, SampleSpec
from shardify.convert.inputs.rawpixels import encode_raw
from shardify.convert.inputs.sniff import (
    SNIFF_BYTES,
    ImageCheckError,
    ImageInfo,
    check_head,
    check_image,
    describe_error,
    sniff_ext,
    transcode_jpeg,
)
from shardify.convert.inputs.tensors import transcode_file
from shardify.convert.write.shardtypes import ShardTask
from shardify.errors import InputError
from shardify.pixels import RAW_EXT

__all__ = ["sample_members"]


def sample_members(
    spec: SampleSpec, key: str, meta: bytes | None, task: ShardTask, notes: list[Ignored]
) -> list[tuple[str, bytes]]:
    """The (extension, bytes) members of one sample, sorted; raises InputError to skip it.
    Decoder warnings about an input are appended to ``notes``."""
    members: list[tuple[str, bytes]] = [("json", meta)] if meta is not None else []
    if spec.label is not None:
        members.append(("cls", str(spec.label).encode("ascii")))
    for source in spec.files:
        path = os.path.join(task.root, source.path)
        try:
            data = _read_input(path, image=source.is_image, limit=task.max_image_bytes)
        except ImageCheckError as e:
            raise InputError(str(e), path=source.path, key=key) from e
        except OSError as e:
            raise InputError(f"cannot read: {e.strerror or e}", path=source.path, key=key) from e
        ext = source.ext
        if source.transcode is not None:
            data = transcode_file(source.transcode, data, path=source.path, key=key, identity=spec.identity)
        if source.is_image:
            try:
                with decoder_messages(native=sniff_ext(data) == "tiff") as messages:
                    data, ext = _image_member(data, source.path, key, task)
            except InputError as e:
                if messages:
                    raise InputError(
                        f"{e.reason} (decoder said: {' | '.join(messages)})", path=source.path, key=key
                    ) from e
                raise
            if messages:
                notes.append(Ignored(source.path, "decoder said: " + " | ".join(messages), "note"))
        members.append((ext, data))
    members.extend(spec.inline)
    members.sort(key=lambda m: m[0])
    for a, b in zip(members, members[1:]):
        if a[0] == b[0]:
            raise InputError(f"two files would be stored as field {a[0]!r}", path=spec.identity, key=key)
    return members


_FIRST_READ = 1 << 30
"""The most bytes asked of one ``read`` (Linux returns at most ~2 GiB per call anyway)."""


def _read_input(path: str, *, image: bool, limit: int | None) -> bytes:
    """The bytes of an input file. An image file is read whole only once its size is within
    ``limit`` and its first bytes (:data:`SNIFF_BYTES`) may be an image, so junk costs bounded
    memory and time. One ``read`` of the size ``fstat`` gives, then one more to see the end
    (a file that grew meanwhile is read to its end)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        if not image:
            return _read_rest(fd, os.read(fd, min(size + 1, _FIRST_READ)))
        if limit is not None and size > limit:
            raise ImageCheckError(f"too large: {size} bytes, over the limit of {limit} (--max-image-bytes)")
        head = _read_rest(fd, os.read(fd, min(size + 1, SNIFF_BYTES)), limit=SNIFF_BYTES)
        whole = len(head) < SNIFF_BYTES
        check_head(head, whole=whole)
        return head if whole else _read_rest(fd, head)
    finally:
        os.close(fd)


_CHUNK = 16 << 20
"""Bytes per ``read`` past the first (files that were larger than ``fstat`` said, or huge)."""


def _read_rest(fd: int, first: bytes, *, limit: int | None = None) -> bytes:
    """``first`` (what was read of ``fd`` so far) and the rest of the file, or up to ``limit``
    bytes in all; the usual case, ``first`` already whole, costs one empty read."""
    parts = [first]
    got = len(first)
    while limit is None or got < limit:
        more = os.read(fd, _CHUNK if limit is None else min(_CHUNK, limit - got))
        if not more:
            break
        parts.append(more)
        got += len(more)
    return first if len(parts) == 1 else b"".join(parts)


def _image_member(data: bytes, path: str, key: str, task: ShardTask) -> tuple[bytes, str]:
    """Check (and maybe transcode) one image; ``(bytes, extension)`` to store."""
    try:
        info = check_image(data, full=task.check_full)
    except ImageCheckError as e:
        raise InputError(str(e), path=path, key=key) from e
    if task.raw_pixels is not None:
        try:
            return encode_raw(data, size=task.raw_pixels, side=task.raw_side), RAW_EXT  # type: ignore[arg-type]
        except Exception as e:  # Pillow's decoder errors have many types; as --check full words them
            raise InputError(f"cannot decode {info.ext}: {describe_error(e)}", path=path, key=key) from e
    ext = info.ext
    if task.max_side is not None:
        try:
            small = transcode_jpeg(data, info, max_side=task.max_side, quality=task.quality)
        except Exception as e:  # Pillow's decoder errors have many types
            raise InputError(f"cannot transcode: {describe_error(e)}", path=path, key=key) from e
        if small is not None:
            data, ext = small, "jpg"
            info = ImageInfo("jpg", info.width, info.height, "RGB")
    if task.image_format != "keep":
        try:
            same = reencode(data, info, image_format=task.image_format, quality=task.quality)  # type: ignore[arg-type]
        except Exception as e:  # Pillow's decoder errors have many types
            raise InputError(f"cannot re-encode as {task.image_format}: {describe_error(e)}", path=path, key=key) from e
        if same is not None:
            data, ext = same
    return data, ext
