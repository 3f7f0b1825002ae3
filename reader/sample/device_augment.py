"""Crop, antialiased resize and flip of a batch of decoded images, in a few batched calls.

Plain torch, so it runs wherever the images are (the GPU after nvJPEG; the CPU in tests).
Each image's resize is separable: ``out = Wy @ img @ Wx^T`` per channel, with ``Wy`` [h, H]
and ``Wx`` [w, W] holding the weights of Pillow's (and torch's) antialiased bilinear filter:
output pixel ``i`` centred at ``start + (i + 0.5) * scale``, a triangle of half-width
``max(scale, 1)``, reading only inside the image's ``bounds``, normalised to sum 1. A flip
reverses the rows of ``Wx``. Images of one chunk are padded to one size (the weights are 0
over the padding), so a chunk is two batched matmuls; chunks keep the float32 padding under
``max_chunk_bytes``. The result is rounded to uint8, as the CPU path's batches are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["resize_weights", "augment_batch", "MAX_CHUNK_BYTES"]

MAX_CHUNK_BYTES = 512 << 20
"""Largest float32 padded input of one batched resize (images are grouped under it)."""


def resize_weights(
    start: torch.Tensor, end: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, *, out: int, length: int
) -> torch.Tensor:
    """float32 [B, out, length]: row i of image b resamples ``[start, end)`` (input pixels,
    fractional allowed) to ``out`` pixels, reading only ``[lo, hi)``; all [B] float64 tensors."""
    device = start.device
    scale = (end - start) / out  # [B]
    support = scale.clamp(min=1.0)  # bilinear: half-width 1, stretched when shrinking
    centers = start[:, None] + (torch.arange(out, device=device, dtype=torch.float64) + 0.5) * scale[:, None]
    xmin = torch.floor(centers - support[:, None] + 0.5).clamp(min=0).maximum(lo[:, None])
    xmax = torch.floor(centers + support[:, None] + 0.5).minimum(hi[:, None])
    j = torch.arange(length, device=device, dtype=torch.float64)
    w = (1.0 - ((j + 0.5 - centers[..., None]) / support[:, None, None]).abs()).clamp(min=0.0)
    w = w * ((j >= xmin[..., None]) & (j < xmax[..., None]))
    total = w.sum(-1, keepdim=True)
    return (w / torch.where(total > 0, total, torch.ones_like(total))).to(torch.float32)


def _chunks(shapes: Sequence[tuple[int, int]], max_bytes: int) -> list[list[int]]:
    """Group image indices (sorted by area) so that each group's padded float32 input fits."""
    order = sorted(range(len(shapes)), key=lambda i: shapes[i][0] * shapes[i][1])
    groups: list[list[int]] = []
    hmax = wmax = 0
    for i in order:
        h, w = shapes[i]
        nh, nw = max(hmax, h), max(wmax, w)
        if groups and (len(groups[-1]) + 1) * 3 * nh * nw * 4 <= max_bytes:
            groups[-1].append(i)
            hmax, wmax = nh, nw
        else:
            groups.append([i])
            hmax, wmax = h, w
    return groups


def read_regions(
    boxes: torch.Tensor, bounds: torch.Tensor, shapes: Sequence[tuple[int, int]], size: tuple[int, int]
) -> list[tuple[int, int, int, int]]:
    """Each image's pixels the resize can read, as integer (left, top, right, bottom): ``bounds``
    cut to the box widened by the filter's support, inside the image (``shapes``: (H, W) each).
    Decoding only this region gives :func:`augment_batch` the same output as the whole image."""
    h, w = size
    regions = []
    for (H, W), (left, top, right, bottom), (bl, bt, br, bb) in zip(
        shapes, boxes.to(torch.float64).tolist(), bounds.to(torch.float64).tolist()
    ):
        sx, sy = max((right - left) / w, 1.0) + 1, max((bottom - top) / h, 1.0) + 1
        x0, y0 = max(int(bl), int(math.floor(left - sx)), 0), max(int(bt), int(math.floor(top - sy)), 0)
        x1 = min(int(math.ceil(br)), int(math.ceil(right + sx)), W)
        y1 = min(int(math.ceil(bb)), int(math.ceil(bottom + sy)), H)
        regions.append((x0, y0, max(x1, x0 + 1), max(y1, y0 + 1)))
    return regions


def augment_batch(
    images: Sequence[torch.Tensor],
    boxes: torch.Tensor,
    bounds: torch.Tensor,
    flips: torch.Tensor,
    size: tuple[int, int],
    *,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """uint8 [B, 3, h, w] on the images' device: image b's ``boxes[b]`` resized to ``size``
    (h, w) reading only inside ``bounds[b]`` (both (left, top, right, bottom), float64 [B, 4],
    any device), mirrored where ``flips[b]``. ``images``: uint8 [3, H_b, W_b] each. ``dtype``:
    of the products (the weights are made in float64 either way); float16 keeps every pixel
    within 1 of float32 (8-bit values and 11-bit weights, float32 accumulation on a GPU)."""
    if not images:
        raise ValueError("augment_batch needs at least one image")
    device = images[0].device
    h, w = size
    boxes, bounds = boxes.to(torch.float64).cpu(), bounds.to(torch.float64).cpu()
    # Only the part of each image the filter can reach is copied: bounds, cut to box +- support.
    regions = read_regions(boxes, bounds, [(int(im.shape[-2]), int(im.shape[-1])) for im in images], size)
    out = torch.empty((len(images), 3, h, w), dtype=torch.uint8, device=device)
    shapes = [(r[3] - r[1], r[2] - r[0]) for r in regions]
    for group in _chunks(shapes, max_chunk_bytes):
        hm, wm = max(shapes[i][0] for i in group), max(shapes[i][1] for i in group)
        padded = torch.zeros((len(group), 3, hm, wm), dtype=torch.uint8, device=device)
        for k, i in enumerate(group):
            x0, y0, x1, y1 = regions[i]
            padded[k, :, : y1 - y0, : x1 - x0] = images[i][:, y0:y1, x0:x1]
        idx = torch.tensor(group)
        off = torch.tensor([[regions[i][0], regions[i][1]] for i in group], dtype=torch.float64).to(device)
        bx, bd = boxes[idx].to(device), bounds[idx].to(device)  # weights are made where they are used
        wy = resize_weights(
            bx[:, 1] - off[:, 1], bx[:, 3] - off[:, 1], bd[:, 1] - off[:, 1], bd[:, 3] - off[:, 1], out=h, length=hm
        )
        wx = resize_weights(
            bx[:, 0] - off[:, 0], bx[:, 2] - off[:, 0], bd[:, 0] - off[:, 0], bd[:, 2] - off[:, 0], out=w, length=wm
        )
        flip = flips.to(device)[idx.to(device)]
        wx = torch.where(flip[:, None, None], wx.flip(1), wx).to(dtype)
        wy = wy.to(dtype)
        x = padded.to(dtype)
        if h * wm <= hm * w:  # the cheaper order of the two products
            y = torch.matmul(torch.matmul(wy[:, None], x), wx[:, None].transpose(-1, -2))
        else:
            y = torch.matmul(wy[:, None], torch.matmul(x, wx[:, None].transpose(-1, -2)))
        out[idx.to(device)] = y.float().round_().clamp_(0, 255).to(torch.uint8)
    return out
