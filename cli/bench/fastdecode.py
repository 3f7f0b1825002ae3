"""The fast-IDCT figure of ``shardify bench``: ``fast_decode=True`` against the exact path.

Both decode and augment the same images with the same crops (the same seeded draws), so
the speed ratio and the pixel difference come from the decoder alone.
"""

from __future__ import annotations

import time

import torch

from shardify.reader.plan.shuffle import sample_rng
from shardify.reader.sample import transforms as T

__all__ = ["fast_decode_figures"]


def fast_decode_figures(encoded: list[tuple[str, bytes]], image_size: int, *, passes: int = 3) -> dict[str, float]:
    """``fast_decode=True`` against the exact path on the same crops: images per CPU second of
    each (this process's CPU time, so other load on the machine counts less; the better of
    ``passes`` alternating passes, so what load remains hits both alike), their ratio, and the
    pixel difference of the outputs (mean and max absolute, in 0..255 levels; share of
    values that differ)."""
    exact = T.Compose([T.RandomResizedCrop(image_size), T.RandomHorizontalFlip()])
    fast = T.Compose([T.RandomResizedCrop(image_size, fast_decode=True), T.RandomHorizontalFlip()])
    best = {"exact": 0.0, "fast": 0.0}
    for _ in range(passes):
        for name, t in (("exact", exact), ("fast", fast)):
            c0 = time.process_time()
            for key, data in encoded:
                T.run_image_transform(t, data, rng=sample_rng(0, 1, key))
            best[name] = max(best[name], len(encoded) / max(time.process_time() - c0, 1e-9))
    total = differ = count = 0
    worst = 0
    for key, data in encoded:
        a = T.run_image_transform(exact, data, rng=sample_rng(0, 1, key))
        b = T.run_image_transform(fast, data, rng=sample_rng(0, 1, key))
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            raise TypeError(
                f"sample {key!r}: the transforms gave {type(a).__name__} and {type(b).__name__}, not tensors"
            )
        d = (a.to(torch.int16) - b.to(torch.int16)).abs()
        total += int(d.sum())
        differ += int((d > 0).sum())
        count += d.numel()
        worst = max(worst, int(d.max()))
    return {
        "exact_ips": best["exact"],
        "fast_ips": best["fast"],
        "ratio": best["fast"] / best["exact"],
        "mean_abs_diff": total / max(1, count),
        "max_abs_diff": float(worst),
        "share_differing": differ / max(1, count),
    }
