"""Which fields a dataset outputs: checked against the split, or chosen from what it holds.

A shardify split index lists the extensions its samples hold (``fields``). When it does,
the fields asked for are checked against it when the dataset is built, so a missing field
is one clear error in the main process, not a traceback from inside a worker at the first
batch. Without ``fields=``, the default follows what the split holds: ``("image", "cls")``
when it has images, else its array or tensor field (``pt``, ``pth``, ``npy``, or its only
data field) with ``cls``; ``cls`` is left out when the split has no labels. Shards without
an index (a list or pattern) list nothing: then the default is ``("image", "cls")`` and
nothing is checked until reading.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shardify.errors import FieldError
from shardify.reader.sample.decode import IMAGE_EXTS
from shardify.reader.sample.processor import IMAGE_FIELD, field_spec, selected_fields
from shardify.suggest import closest

if TYPE_CHECKING:
    from shardify.reader.streams import Stream

__all__ = ["TENSOR_FIELDS", "SPECIAL_FIELDS", "output_fields", "stream_fields", "loaded_fields"]

TENSOR_FIELDS = ("pt", "pth", "npy")
"""Array or tensor extensions, in order of preference for the default field."""

_META_FIELDS = frozenset({"cls", "json"})

SPECIAL_FIELDS = ("__key__", "__stream__", "__valid__")
"""Names available in ``fields=`` and ``map`` dicts besides the sample's extensions."""


def _images(held: Sequence[str], image_exts: frozenset[str]) -> list[str]:
    return [f for f in held if f in image_exts]  # as the pipeline matches "image": exactly


def _name_to_use(spec: str, held: Sequence[str], image_exts: frozenset[str]) -> str:
    """``; for the images use "image" ...`` (when the split holds images), else the closest held name."""
    images = _images(held, image_exts)
    if images:
        return (
            f"; for the images use {IMAGE_FIELD!r} (any image extension: here "
            f"{', '.join(repr(f) for f in images)}), e.g. fields=({IMAGE_FIELD!r}, 'cls')"
        )
    meant = closest(spec, held)
    return f"; did you mean {meant!r}?" if meant else ""


def output_fields(requested: Sequence[str] | None, held: Sequence[str], *, where: str) -> tuple[str, ...]:
    """The output fields of a dataset whose split holds the extensions ``held`` (empty: unknown).

    ``requested`` is checked (each entry must match a held extension); None chooses the
    default (see the module docstring). Raises :class:`~shardify.errors.FieldError` naming
    ``where`` and what the split holds.
    """
    held = tuple(held)
    if requested is not None:
        if held:
            for spec in requested:
                if not set(field_spec(spec, IMAGE_EXTS)) & set(held):
                    raise FieldError(
                        f"{where}: no field {spec!r} in this split (its samples hold {', '.join(held)}); "
                        f"choose fields among those{_name_to_use(spec, held, IMAGE_EXTS)}"
                    )
        return tuple(requested)
    labels = ("cls",) if "cls" in held or not held else ()
    if not held or _images(held, IMAGE_EXTS):
        return (IMAGE_FIELD, *labels)
    data = [f for f in held if f not in _META_FIELDS]
    tensor = next((f for f in TENSOR_FIELDS if f in data), None)
    if tensor is None and len(data) == 1:
        tensor = data[0]
    if tensor is None:
        raise FieldError(
            f"{where}: this split has no images and no single data field to default to "
            f"(its samples hold {', '.join(held)}); choose fields among those"
        )
    return (tensor, *labels)


def stream_fields(
    stream: Stream, *, fields: Sequence[str] | None, map: Callable[[dict[str, Any]], Any] | None
) -> tuple[str, ...]:
    """A stream's output columns (``fields``, ``map``: the dataset's, for a stream without its
    own), checked against the extensions its split holds (the :data:`SPECIAL_FIELDS` pass), or
    the default for them; none when a ``map`` builds the output."""
    if stream.map is not None or (stream.fields is None and map is not None):
        return ()
    src = stream.source
    where = f"{src.name} split {src.split!r}"  # type: ignore[union-attr]
    requested = stream.fields if stream.fields is not None else fields
    if requested is None:
        return output_fields(None, src.fields, where=where)  # type: ignore[union-attr]
    output_fields(
        tuple(f for f in requested if f not in SPECIAL_FIELDS),
        src.fields,  # type: ignore[union-attr]
        where=where,
    )  # raises for a field the split does not hold
    return tuple(requested)


def loaded_fields(columns: Sequence[Sequence[str]]) -> frozenset[str] | None:
    """The extensions the shard reader loads for each stream's output ``columns`` (None: all,
    when a stream has none because its ``map`` sees every field)."""
    if any(not c for c in columns):
        return None
    return frozenset().union(*(selected_fields(c) for c in columns))
