"""The base of the worker-side image transforms, and how a user callable is seeded and its result made a tensor.

Kept apart from :mod:`~shardify.reader.sample.transforms` (the crops and :class:`Compose`) and
:mod:`~shardify.reader.sample.color` so that each stays small; users import all of them from
``shardify.reader.transforms``.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import torch
from PIL import Image

from .clock import augmenting
from .decode import decode_image, pil_to_tensor

__all__ = ["Transform"]


def _as_output(value: object) -> object:
    return pil_to_tensor(value) if isinstance(value, Image.Image) else value


def _seed_globals(rng: random.Random) -> None:
    """Seed Python's, numpy's and torch's global RNGs from ``rng`` (~6 us, for user callables)."""
    seed = rng.getrandbits(64)
    random.seed(seed)
    np.random.seed(seed & 0xFFFF_FFFF)
    torch.default_generator.manual_seed(seed)  # torch.manual_seed also seeds CUDA: ~90 us


class Transform:
    """Base class: ``__call__(img, rng)`` on PIL; ``apply_encoded(data, rng)`` from bytes.

    A subclass may also define ``apply_tensor(x, rng)`` on a uint8 [3, H, W] tensor, drawing
    from ``rng`` exactly as ``__call__`` does; the fast path then stays on tensors.
    """

    apply_tensor: Callable[[torch.Tensor, random.Random], torch.Tensor] | None = None

    def __call__(self, img: Image.Image, rng: random.Random) -> Image.Image:
        raise NotImplementedError

    def apply_encoded(self, data: bytes, rng: random.Random) -> torch.Tensor:
        """Decode ``data``, apply the transform and return a uint8 CHW tensor."""
        img = decode_image(data)
        return augmenting(lambda: pil_to_tensor(self(img, rng)))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"
