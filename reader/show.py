"""``shardify show``: look at what the model will see, as one PNG contact sheet.

:func:`contact_sheet` reads ``n`` samples spread evenly over a split (shard order, so the
same samples every time), and lays them out in a grid: each cell is the image (fitted into a
square tile) with its key and label (class name and index) under it. With a ``transform``
(``--augment``: the training recipe), a cell shows the stored image and then ``views``
outputs of the transform side by side, view ``v`` being what epoch ``v`` gives that sample
(the same seeded draws as the loader: seed, epoch, key). A split without images gets a text
summary instead: each sample's key and fields, decoded (shapes and dtypes of arrays and
tensors, labels, the start of texts).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from shardify.reader.io.sources import Source
from shardify.reader.io.stream import Lost, ShardReader
from shardify.reader.io.tablesetup import sample_tables
from shardify.reader.plan.shuffle import sample_rng
from shardify.reader.sample.decode import IMAGE_EXTS, decode_field, decode_image, tensor_to_pil
from shardify.reader.sample.transforms import run_image_transform

__all__ = ["Sheet", "contact_sheet", "spread_positions", "describe_value"]

_BACKGROUND = (24, 24, 24)
_TEXT = (235, 235, 235)
_GAP = 4
_CAPTION_LINES = 2


@dataclass
class Sheet:
    """A contact sheet: ``image`` (None when the split has no images) and a text summary;
    ``cells`` are the ``(key, label text)`` of the samples shown, in grid order."""

    image: Image.Image | None
    text: str
    cells: list[tuple[str, str]] = field(default_factory=list)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the image as PNG (ValueError when there is none)."""
        if self.image is None:
            raise ValueError("this split has no images: nothing to draw (see .text)")
        self.image.save(path, format="PNG")


def spread_positions(total: int, n: int) -> list[int]:
    """``min(n, total)`` positions spread evenly over ``range(total)``, in order, first one 0."""
    n = min(n, total)
    return [i * total // n for i in range(n)]


def _read(source: Source, positions: list[int]) -> list[dict[str, object]]:
    starts = [0]
    for s in source.sizes:
        starts.append(starts[-1] + s)
    reader = ShardReader(
        [s.url for s in source.shards],
        source.sizes,
        skip_damaged=True,
        opener=source.open_tar,
        chunks=[s.chunk for s in source.shards],
        tables=sample_tables([source]),  # each sample checked, as the loader does
    )
    out = []
    try:
        shard = 0
        for p in positions:
            while starts[shard + 1] <= p:
                shard += 1
            item = next(iter(reader.read(shard, p - starts[shard], p - starts[shard] + 1)))
            if not isinstance(item, Lost):
                out.append(item)
    finally:
        reader.close()
    return out


def _label(sample: dict[str, object], classes: tuple[str, ...]) -> str:
    raw = sample.get("cls")
    if not isinstance(raw, bytes):
        return ""
    text = raw.decode("utf-8", "replace").strip()
    try:
        i = int(text)
    except ValueError:
        return text
    return f"{classes[i]} ({i})" if 0 <= i < len(classes) else str(i)


def describe_value(ext: str, data: bytes) -> str:
    """A short readable description of one field's value (decoded by extension)."""
    try:
        value = decode_field(ext, data)
    except Exception as e:  # noqa: BLE001 - a summary names the failure instead of raising
        return f"<{len(data)} bytes: {type(e).__name__}>"
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"{type(value).__name__} {tuple(shape)} {getattr(value, 'dtype', '')}".strip()
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _text_summary(source: Source, samples: list[dict[str, object]]) -> str:
    lines = [
        f"{source.name} split {source.split!r}: {source.num_samples} samples in {len(source.shards)} shards; "
        f"fields {', '.join(source.fields) or '(not listed)'}; no images, so no picture: "
        f"{len(samples)} samples spread over the split:"
    ]
    for s in samples:
        fields = [
            f"{k}={describe_value(k, v)}" for k, v in s.items() if not k.startswith("__") and isinstance(v, bytes)
        ]
        lines.append(f"  {s['__key__']}: " + "; ".join(fields))
    return "\n".join(lines)


def _fit(img: Image.Image, tile: int) -> Image.Image:
    """``img`` scaled to fit a ``tile`` square (aspect kept), centred on the background."""
    img = img.convert("RGB")
    scale = tile / max(img.width, img.height)
    size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
    out = Image.new("RGB", (tile, tile), _BACKGROUND)
    out.paste(img.resize(size, Image.Resampling.BILINEAR), ((tile - size[0]) // 2, (tile - size[1]) // 2))
    return out


def _image_field(sample: dict[str, object]) -> bytes | None:
    return next((v for k, v in sample.items() if k in IMAGE_EXTS and isinstance(v, bytes)), None)


def _views(data: bytes, key: str, transform: Callable[..., Any] | None, views: int, seed: int) -> list[Image.Image]:
    out = [decode_image(data)]
    if transform is not None:
        for epoch in range(views):
            value = run_image_transform(transform, data, rng=sample_rng(seed, epoch, key))
            out.append(tensor_to_pil(value) if not isinstance(value, Image.Image) else value)  # type: ignore[arg-type]
    return out


def contact_sheet(
    source: Source,
    *,
    n: int = 64,
    transform: Callable[..., Any] | None = None,
    views: int = 4,
    tile: int = 128,
    seed: int = 0,
    columns: int | None = None,
) -> Sheet:
    """The contact sheet of ``n`` samples of ``source`` (see the module docstring).

    ``tile``: pixels of each image's square; ``columns``: cells per row (default: a square-ish
    grid); ``transform``/``views``/``seed``: the augmented views, as the loader draws them.
    """
    if n < 1 or tile < 16 or views < 1:
        raise ValueError(f"{n=} should be >= 1, {tile=} >= 16 and {views=} >= 1")
    samples = _read(source, spread_positions(source.num_samples, n))
    found = [(s, _image_field(s)) for s in samples]
    images = [(s, d) for s, d in found if d is not None]
    if not images:
        return Sheet(image=None, text=_text_summary(source, samples))
    font = ImageFont.load_default()
    per_cell = 1 + (views if transform is not None else 0)
    line = 12
    cell_w = per_cell * tile + (per_cell - 1) * _GAP
    cell_h = tile + _CAPTION_LINES * line + 2
    cols = columns or max(1, round(math.sqrt(len(images) / per_cell)))
    rows = math.ceil(len(images) / cols)
    sheet = Image.new("RGB", (cols * cell_w + (cols + 1) * _GAP, rows * cell_h + (rows + 1) * _GAP), _BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    cells = []
    for i, (sample, data) in enumerate(images):
        key, label = str(sample["__key__"]), _label(sample, source.classes)
        x0 = _GAP + (i % cols) * (cell_w + _GAP)
        y0 = _GAP + (i // cols) * (cell_h + _GAP)
        try:
            pictures = _views(data, key, transform, views, seed)
        except Exception as e:  # noqa: BLE001 - a broken sample is shown as such, not fatal
            pictures, label = [], f"{label} [cannot decode: {type(e).__name__}]"
        for j, picture in enumerate(pictures):
            sheet.paste(_fit(picture, tile), (x0 + j * (tile + _GAP), y0))
        chars = max(8, cell_w // 6)
        draw.text((x0, y0 + tile + 1), key[:chars], fill=_TEXT, font=font)
        draw.text((x0, y0 + tile + 1 + line), label[:chars], fill=_TEXT, font=font)
        cells.append((key, label))
    views_text = f", each with {views} augmented views (epochs 0..{views - 1})" if transform is not None else ""
    text = (
        f"{source.name} split {source.split!r}: {len(images)} of {source.num_samples} samples in a "
        f"{rows}x{cols} grid{views_text}"
    )
    return Sheet(image=sheet, text=text, cells=cells)
