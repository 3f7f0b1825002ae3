"""One tar header block read into its fields, and the rules a member must meet to be read.

The one header parser of the reader side: the full member walk
(:mod:`shardify.tarmembers`) and the fast layout scan (:mod:`shardify.tarlayout`) both take a
header's name, size, type and stored checksum from :func:`header_fields`; the walk then
checks the checksum with :func:`checksum_ok`, the scan checks a window of them at once.
"""

from __future__ import annotations

from shardify.tarfmt import BLOCK

__all__ = [
    "ZERO_BLOCK",
    "header_fields",
    "octal",
    "checksum_ok",
    "pax_records",
    "member_problem",
    "PaxError",
]

ZERO_BLOCK = bytes(BLOCK)
REGULAR = (b"0", b"\x00", b"7")
NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")
_SKIPPED_SILENTLY = (b"5", b"g")  # directories, global PAX headers
_KINDS = {b"1": "hard link", b"2": "symbolic link", b"3": "character device", b"4": "block device", b"6": "FIFO"}


class PaxError(ValueError):
    """A PAX extension header that cannot be read (the caller names the shard)."""


def octal(field: bytes, what: str) -> int:
    """The number in a numeric header field: octal text, or GNU base-256 when its top bit is
    set; an empty field is 0. ValueError names the field (``what``)."""
    if field and field[0] & 0x80:  # GNU base-256
        value = int.from_bytes(field[1:], "big")
        return -value if field[0] & 0x40 else value
    text = field.split(b"\x00", 1)[0].strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError as e:
        raise ValueError(f"{what} field {field!r} is not octal") from e


def header_fields(header: bytes) -> tuple[bytes, int, bytes, int]:
    """``(raw name, size, typeflag, stored checksum)`` of the 512-byte ``header``; the name
    has its ustar prefix joined. ValueError: a numeric field that is not a number."""
    sum_field, size_field = header[148:156], header[124:136]
    if (sum_field[0] | size_field[0]) & 0x80:  # GNU base-256
        stored, size = octal(sum_field, "checksum"), octal(size_field, "size")
    else:  # octal text, as :func:`octal` reads it, without its calls (the layout scan's hot path)
        try:
            stored = int(sum_field.split(b"\x00", 1)[0].strip(b" ") or b"0", 8)
            size = int(size_field.split(b"\x00", 1)[0].strip(b" ") or b"0", 8)
        except ValueError:
            stored, size = octal(sum_field, "checksum"), octal(size_field, "size")  # raises, naming the field
    raw_name = header[0:100].split(b"\x00", 1)[0]
    if header[345] != 0 and header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\x00", 1)[0]
        if prefix:
            raw_name = prefix + b"/" + raw_name
    return raw_name, size, header[156:157], stored


def checksum_ok(header: bytes, stored: int) -> bool:
    """Whether ``stored`` is the header's checksum, summed unsigned or (old tars) signed."""
    unsigned = sum(header[:148]) + 256 + sum(header[156:])
    if unsigned == stored:
        return True
    signed = sum((b ^ 0x80) - 0x80 for b in header[:148]) + 256
    signed += sum((b ^ 0x80) - 0x80 for b in header[156:])
    return signed == stored


def pax_records(data: bytes) -> dict[str, str]:
    """The ``key=value`` records of a PAX extension header's data; PaxError when malformed."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError as e:
            raise PaxError("bad record length") from e
        if length <= 0 or pos + length > len(data):
            raise PaxError("record overruns the header")
        record = data[space + 1 : pos + length - 1]
        key, _, value = record.partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def _unsafe_reason(name: str) -> str | None:
    if "/" not in name and "\\" not in name and "\x00" not in name:
        return ".. is not a file name" if name == ".." else None
    if name.startswith("/") or name.startswith("\\"):
        return "absolute member name"
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        return "member name contains '..'"
    if "\x00" in name:
        return "member name contains NUL"
    return None


def member_problem(name: str, typeflag: bytes, size: int, max_member: int) -> str | None:
    """Why a member is not yielded: None if it is fine, "" to skip it silently."""
    if typeflag in _SKIPPED_SILENTLY:
        return ""
    if typeflag not in REGULAR:
        kind = _KINDS.get(typeflag, f"member of type {typeflag!r}")
        return f"{kind}, not a regular file"
    reason = _unsafe_reason(name)
    if reason is not None:
        return reason
    if not name.isascii():
        try:
            name.encode("utf-8")  # undecodable bytes became surrogates, which do not encode
        except UnicodeEncodeError:
            return "member name is not UTF-8"
    if size > max_member:
        return f"member declares {size} bytes, over the limit of {max_member}"
    return None
