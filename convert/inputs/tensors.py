"""Store torch tensor files as ``.npy`` while converting (``shardify convert ids --pt-to-npy``).

Reading a ``.npy`` member costs a few microseconds (:func:`shardify.npy.decode_array`);
``torch.load(weights_only=True)`` of the same tensor costs hundreds, and bounds the reading
speed of small tensors. Each ``.pt``/``.pth`` file is loaded with ``weights_only=True``
(so a pickled object is refused, never run) and must hold exactly one tensor; its dtype,
shape and values are kept exactly (see :mod:`shardify.npy` for dtypes numpy lacks).
"""

from __future__ import annotations

import io
import pickle
import re

from shardify.errors import ArrayFormatError, InputError
from shardify.npy import encode_tensor

__all__ = ["TENSOR_EXTS", "PT_TO_NPY", "pt_to_npy", "transcode_file"]

TENSOR_EXTS = frozenset({"pt", "pth"})
"""Source extensions stored as ``npy`` with ``pt_to_npy=True``."""
PT_TO_NPY = "pt-npy"
"""The :attr:`SourceFile.transcode` tag of a tensor file stored as ``.npy``."""


def pt_to_npy(data: bytes, *, path: str, key: str, identity: str) -> bytes:
    """The ``.npy`` bytes of the one tensor in torch file ``data``; InputError (skip) otherwise."""
    import torch

    where = f"ID {identity!r}"
    try:
        obj = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        found = _GLOBAL.search(str(e))
        if found is None:
            raise InputError(
                f"{where}: cannot load as a torch file with weights_only=True: {_detail(e)}", path=path, key=key
            ) from e
        raise InputError(
            f"{where}: torch.load(weights_only=True) refused it: it holds a pickled object "
            f"({found.group(1)}), not only tensors; --pt-to-npy stores plain tensors only",
            path=path,
            key=key,
        ) from e
    except Exception as e:  # noqa: BLE001 - a damaged zip or pickle raises many types
        raise InputError(f"{where}: cannot load as a torch file: {type(e).__name__}: {e}", path=path, key=key) from e
    if not isinstance(obj, torch.Tensor):
        raise InputError(
            f"{where}: holds a {type(obj).__name__}, not one tensor; --pt-to-npy stores a single tensor per file",
            path=path,
            key=key,
        )
    try:
        return encode_tensor(obj)
    except ArrayFormatError as e:
        raise InputError(f"{where}: {e}", path=path, key=key) from e


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
"""How torch's weights-only unpickler names the global it refused to load."""


def _detail(e: BaseException) -> str:
    """The informative line of torch's long weights-only error (the last that is not advice)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.strip().endswith(":")]
    useful = [
        ln
        for ln in lines
        if not ln.startswith(("Weights only load failed", "Check the documentation", "Please file", "(1)", "(2)"))
    ]
    return (useful or lines or [type(e).__name__])[-1][:200]


_TRANSCODERS = {PT_TO_NPY: pt_to_npy}


def transcode_file(tag: str, data: bytes, *, path: str, key: str, identity: str) -> bytes:
    """Apply the transcoder ``tag`` names (a :attr:`SourceFile.transcode`) to a file's bytes."""
    try:
        fn = _TRANSCODERS[tag]
    except KeyError:
        raise ValueError(f"unknown transcode tag {tag!r}; known: {sorted(_TRANSCODERS)}") from None
    return fn(data, path=path, key=key, identity=identity)
