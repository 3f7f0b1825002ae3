"""Per-image time of a transform's JPEG fast path against the plain path, on one core.

    python tools/bench_transforms.py --count 200 --width 500 --height 375
    python tools/bench_transforms.py --preset eval --width 1024 --height 768

Plain path: decode the whole image to RGB, transform the PIL image, copy to a uint8 tensor.
Fast path: ``run_image_transform`` (header size -> crop -> DCT draft -> resize of the crop).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Sequence

import torch
from benchlib import corpus, timing

from shardify.reader import transforms as T
from shardify.reader.sample.decode import decode_image

__all__ = ["main"]

PRESETS: dict[str, Callable[[], T.Transform]] = {
    "train": T.imagenet_train,
    "eval": T.imagenet_eval,
    "jitter": T.ScaleJitter,
}


def _per_image_us(fn: Callable[[bytes, random.Random], object], images: list[bytes], repeat: int) -> float:
    def one_pass() -> None:
        for k, data in enumerate(images):
            fn(data, random.Random(k))

    return timing.best_of(one_pass, repeat) / len(images) * 1e6


def main(argv: Sequence[str] | None = None) -> None:
    """Print the per-image microseconds of both paths and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--width", type=int, default=500)
    parser.add_argument("--height", type=int, default=375)
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="train")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many passes")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    images = corpus.jpegs(args.count, width=args.width, height=args.height, quality=args.quality)
    t = PRESETS[args.preset]()

    def plain(data: bytes, rng: random.Random) -> object:
        return T.pil_to_tensor(t(decode_image(data), rng))

    def fast(data: bytes, rng: random.Random) -> object:
        return T.run_image_transform(t, data, rng=rng)

    plain_us = _per_image_us(plain, images, args.repeat)
    fast_us = _per_image_us(fast, images, args.repeat)
    kb = sum(map(len, images)) / len(images) / 1024
    print(f"{args.count} JPEGs {args.width}x{args.height} q{args.quality} (~{kb:.0f} KiB), {t!r}")
    print(f"plain path: {plain_us:8.0f} us/image  ({1e6 / plain_us:6.0f} images/s)")
    print(f"fast path:  {fast_us:8.0f} us/image  ({1e6 / fast_us:6.0f} images/s)  x{plain_us / fast_us:.2f}")


if __name__ == "__main__":
    main()
