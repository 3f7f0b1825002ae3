"""The one place for ``.npy`` in shardify: a deterministic encoder, a fast decoder, tensor views.

Encoding (:func:`encode_array`) writes npy format 1.0: the header dict
``{'descr': ..., 'fortran_order': False, 'shape': (...), }`` padded with spaces to a multiple
of 64 bytes and ending in ``\\n``, then the array's bytes in C order, little-endian. So the
same values give the same bytes, whatever the input's memory order or byte order, and
``np.load`` reads the result as it reads its own files. Object arrays (pickles) and other
structured arrays are refused.

Torch dtypes numpy lacks (``bfloat16``, the ``float8_*`` types, ``complex32``) are stored as
a *raw view*: a one-field structured dtype named after the torch dtype over an unsigned int
of the same size, e.g. ``descr [('bfloat16', '<u2')]``. The bits are kept exactly; ``np.load``
reads such a file as that structured array, and :func:`array_to_tensor` turns it back into
the torch dtype. Quantized and other torch dtypes are refused.

Decoding (:func:`decode_array`) reads the small header once per distinct header (a cached
dict keyed by its bytes, parsed with ``ast.literal_eval`` as numpy does), then copies the
data with ``np.frombuffer``: a few microseconds per small array instead of ``np.load``'s
~100. Object arrays are refused unless ``allow_pickle=True`` (then ``np.load`` runs).
"""

from __future__ import annotations

import ast
import io
import struct
from typing import TYPE_CHECKING, Any

import numpy as np

from shardify.errors import ArrayFormatError, ObjectArrayError

if TYPE_CHECKING:
    import torch

__all__ = [
    "RAW_VIEWS",
    "MAX_HEADER_BYTES",
    "encode_array",
    "decode_array",
    "view_array",
    "npy_header",
    "npy_layout",
    "raw_view_name",
    "tensor_to_array",
    "array_to_tensor",
    "encode_tensor",
]

MAGIC = b"\x93NUMPY"
ALIGN = 64
"""numpy pads the header so the data starts at a multiple of 64 bytes."""

RAW_VIEWS: dict[str, str] = {
    "bfloat16": "<u2",
    "complex32": "<u4",
    "float8_e4m3fn": "|u1",
    "float8_e4m3fnuz": "|u1",
    "float8_e5m2": "|u1",
    "float8_e5m2fnuz": "|u1",
    "float8_e8m0fnu": "|u1",
}
"""Torch dtypes numpy lacks -> the unsigned int their bits are stored as (see the module doc)."""

_NATIVE_KINDS = frozenset("biufcSUmM")
"""numpy kinds stored as they are: bool, ints, floats, complex, bytes, str, datetimes."""
_TORCH_NATIVE = (
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
)
"""Torch dtypes with a numpy twin of the same name."""

_MAX_CACHED_HEADERS = 4096
MAX_HEADER_BYTES = 10_000
"""numpy's own default limit (``max_header_size``): a longer header is refused unparsed."""
_headers: dict[bytes, tuple[np.dtype[Any], tuple[int, ...], bool, int]] = {}


def raw_view_name(dtype: np.dtype[Any]) -> str | None:
    """The torch dtype name a raw-view structured dtype stands for, else None."""
    names = dtype.names
    if names is None or len(names) != 1 or names[0] not in RAW_VIEWS:
        return None
    base = dtype.fields[names[0]][0]  # type: ignore[index]
    return names[0] if base == np.dtype(RAW_VIEWS[names[0]]) and base.itemsize == dtype.itemsize else None


def _stored_dtype(dtype: np.dtype[Any]) -> tuple[np.dtype[Any], str]:
    """The little-endian dtype an array is stored as, and its header ``descr`` text."""
    name = raw_view_name(dtype)
    if name is not None:
        raw = np.dtype(RAW_VIEWS[name])
        return np.dtype([(name, raw)]), repr([(name, raw.str)])
    if dtype.hasobject:
        raise ObjectArrayError(f"cannot store an object array (dtype {dtype}) as .npy: it would need pickle")
    if dtype.kind not in _NATIVE_KINDS or dtype.names is not None or dtype.subdtype is not None:
        raise ArrayFormatError(
            f"cannot store dtype {dtype} as .npy: only numbers, bools, strings, datetimes "
            f"and the raw views {sorted(RAW_VIEWS)} are stored"
        )
    stored = dtype if dtype.byteorder == "|" else dtype.newbyteorder("<")
    return stored, repr(stored.str)


def encode_array(array: np.ndarray) -> bytes:
    """The ``.npy`` bytes of ``array`` (format 1.0, C order, little-endian): deterministic."""
    if not isinstance(array, np.ndarray):
        raise ArrayFormatError(f"encode_array wants a numpy array, got {type(array).__name__}")
    dtype, descr = _stored_dtype(array.dtype)
    header = npy_header(descr, tuple(int(n) for n in array.shape))
    data = (
        np.ascontiguousarray(array).astype(dtype, copy=False)
        if array.dtype.names is None
        else (np.ascontiguousarray(array).view(dtype))
    )
    return header + data.tobytes()


def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """The format-1.0 ``.npy`` header (magic included) of a C-order array: ``descr`` is the
    dtype's literal as the header writes it (``"'<u2'"``), padded to 64 bytes."""
    header = f"{{'descr': {descr}, 'fortran_order': False, 'shape': {shape!r}, }}"
    pad = -(len(MAGIC) + 4 + len(header) + 1) % ALIGN
    text = (header + " " * pad + "\n").encode("latin1")
    if len(text) > 0xFFFF:
        raise ArrayFormatError(f"the .npy header of shape {shape} would exceed format 1.0's 65535 bytes")
    return MAGIC + b"\x01\x00" + struct.pack("<H", len(text)) + text


def _parse_header(text: bytes, major: int) -> tuple[np.dtype[Any], tuple[int, ...], bool, int]:
    """(dtype, shape, fortran_order, data bytes) of a header; what ``np.load`` would accept."""
    try:
        d = ast.literal_eval(text.decode("utf8" if major >= 3 else "latin1"))
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError) as e:
        raise ArrayFormatError(f"unreadable .npy header {text[:80]!r}: {e}") from e
    if not isinstance(d, dict) or set(d) != {"descr", "fortran_order", "shape"}:
        raise ArrayFormatError(f".npy header should be a dict of descr, fortran_order, shape: {text[:80]!r}")
    shape, fortran = d["shape"], d["fortran_order"]
    if (
        not isinstance(shape, tuple)
        or not all(isinstance(n, int) and n >= 0 for n in shape)
        or not isinstance(fortran, bool)
    ):
        raise ArrayFormatError(f".npy header has a bad shape or fortran_order: {text[:80]!r}")
    try:
        dtype = np.lib.format.descr_to_dtype(d["descr"])
    except (TypeError, ValueError) as e:
        raise ArrayFormatError(f".npy header has a bad descr {d['descr']!r}: {e}") from e
    count = 1
    for n in shape:
        count *= n
    return dtype, shape, fortran, count * dtype.itemsize


def npy_layout(view: bytes | memoryview) -> tuple[np.dtype[Any], tuple[int, ...], bool, int, int]:
    """(dtype, shape, fortran_order, data bytes, data offset) of ``.npy`` bytes, of which only
    the header needs to be there; the header is parsed once per distinct header (cached)."""
    if view[:6] != MAGIC or len(view) < 10:
        raise ArrayFormatError(f"not .npy data: {bytes(view[:8])!r} is not the \\x93NUMPY magic")
    major = view[6]
    if major == 1:
        start, size = 10, view[8] | view[9] << 8
    elif major in (2, 3):
        start, size = 12, int.from_bytes(view[8:12], "little")
    else:
        raise ArrayFormatError(f".npy format version {major}.{view[7]} is not known")
    offset = start + size
    if size > MAX_HEADER_BYTES:
        raise ArrayFormatError(f".npy header of {size} bytes exceeds {MAX_HEADER_BYTES} (numpy's limit too)")
    if len(view) < offset:
        raise ArrayFormatError(f"truncated .npy: {len(view)} bytes, the header alone needs {offset}")
    text = bytes(view[start:offset])
    parsed = _headers.get(text)
    if parsed is None:
        parsed = _parse_header(text, major)
        if len(_headers) >= _MAX_CACHED_HEADERS:
            _headers.clear()
        _headers[text] = parsed
    return (*parsed, offset)


def decode_array(data: bytes | bytearray | memoryview, *, allow_pickle: bool = False) -> np.ndarray:
    """The array in ``.npy`` bytes (any format version), as a new writable, native-order array.

    Raises :class:`ObjectArrayError` for an object array unless ``allow_pickle``, and
    :class:`ArrayFormatError` for anything else that is not a whole ``.npy``.
    """
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    dtype, shape, fortran, nbytes, offset = npy_layout(view)
    if dtype.hasobject:
        if not allow_pickle:
            raise ObjectArrayError(
                f"object array (dtype {dtype}): loading it would unpickle, refused with allow_pickle=False; "
                "pass allow_pickle=True only for data you trust"
            )
        loaded: np.ndarray = np.load(io.BytesIO(bytes(view)), allow_pickle=True)
        return loaded
    arr = _view(view, dtype, shape, fortran, nbytes, offset)
    native = dtype if dtype.isnative else dtype.newbyteorder("=")
    return np.array(arr, dtype=native, order="C", copy=True)


def view_array(data: bytes | memoryview) -> np.ndarray:
    """The array in ``.npy`` bytes as a read-only view of ``data`` (no copy; stored byte order).

    Object arrays raise :class:`ObjectArrayError` (a view cannot hold them), anything else
    that is not a whole ``.npy`` :class:`ArrayFormatError`. Used to slice stacked chunk members."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    dtype, shape, fortran, nbytes, offset = npy_layout(view)
    if dtype.hasobject:
        raise ObjectArrayError(f"object array (dtype {dtype}) cannot be viewed")
    return _view(view, dtype, shape, fortran, nbytes, offset)


def _view(
    view: bytes | memoryview, dtype: np.dtype[Any], shape: tuple[int, ...], fortran: bool, nbytes: int, offset: int
) -> np.ndarray:
    if len(view) - offset != nbytes:
        raise ArrayFormatError(f".npy data is {len(view) - offset} bytes, its header says {nbytes} ({dtype} {shape})")
    if nbytes == 0:
        return np.zeros(shape, dtype=dtype)
    flat = np.frombuffer(view, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset)
    return flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)


def tensor_to_array(tensor: torch.Tensor) -> np.ndarray:
    """A numpy array with ``tensor``'s exact dtype (or raw view), shape and values, on the CPU."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise ArrayFormatError(f"tensor_to_array wants a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested:
        raise ArrayFormatError(
            f"cannot store a {tensor.layout} / quantized / nested tensor as .npy; "
            "store a dense tensor (tensor.to_dense())"
        )
    name = str(tensor.dtype).removeprefix("torch.")
    t = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous()
    if name in _TORCH_NATIVE:
        return t.numpy()
    if name in RAW_VIEWS:
        raw = t.reshape(-1).view(torch.uint8).numpy()
        return raw.view(np.dtype([(name, RAW_VIEWS[name])])).reshape(tuple(t.shape))
    raise ArrayFormatError(
        f"cannot store dtype {tensor.dtype} as .npy: numpy has no twin and no raw view "
        f"is defined for it (raw views: {sorted(RAW_VIEWS)})"
    )


def array_to_tensor(array: np.ndarray) -> torch.Tensor:
    """The torch tensor of an array from :func:`decode_array`: raw views back to their dtype."""
    import torch

    name = raw_view_name(array.dtype)
    if name is not None:
        if not hasattr(torch, name):
            raise ArrayFormatError(f"this torch has no dtype {name}, which the array was stored as")
        flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        return (
            torch.from_numpy(flat.copy() if not flat.flags.writeable else flat)
            .view(getattr(torch, name))
            .reshape(array.shape)
        )
    if array.dtype.name not in _TORCH_NATIVE:
        raise ArrayFormatError(f"torch has no dtype for a numpy {array.dtype} array")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


def encode_tensor(tensor: torch.Tensor) -> bytes:
    """``encode_array(tensor_to_array(tensor))``: the ``.npy`` bytes of a torch tensor."""
    return encode_array(tensor_to_array(tensor))
