"""``convert_tokens``: tokenize the texts of a JSONL or Parquet column (or any texts) into a split.

Each text becomes one sample, key ``{row:09d}``, whose one field ``tokens.npy`` is a 1-D
``.npy`` of the document's token ids (``uint16`` when the vocabulary fits, else ``uint32``),
with the end-of-document token appended when ``eos`` is set. The split is in the chunked
layout by default (``chunk=256`` documents per tar member: a document costs no tar header),
and its index records, per shard, every document's length in tokens (``ShardEntry.tokens``)
and, for the split, the field, dtype, vocabulary size and EOS id (:class:`TokenInfo`): a
reader plans sequences from the index alone, and the ``.npy`` header of a 1-D token array is
always 128 bytes, so token ``t`` of a document starts ``128 + t * itemsize`` bytes into it.

It is :func:`~shardify.convert.pyapi.fromitems.run_items` with a runner that tokenizes a
chunk of texts in one batch call (``encode_batch_fast``/``encode_batch`` of a Hugging Face
``tokenizers.Tokenizer``; a Python callable ``str -> list[int]`` is called per text), in
worker processes or Ray tasks: the same order, determinism, resuming and report. A worker
loads the tokenizer once. A row that is not text, is empty, has no tokens or makes the
tokenizer raise is reported in ``{split}.report.jsonl`` and counted as skipped.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Iterable, Sequence, Sized
from dataclasses import dataclass, replace
from typing import Any, Literal, cast

import numpy as np

from shardify.convert.pyapi.fromitems import ItemsOptions, RunSpec, run_items
from shardify.convert.pyapi.itemchunks import ChunkRunner, ItemChunk, Outcome
from shardify.convert.pyapi.jsonlitems import load_function
from shardify.convert.pyapi.textrows import MissingText, TextRows
from shardify.convert.pyapi.values import ValueOptions
from shardify.convert.write.identity import fingerprint
from shardify.convert.write.session import SplitSummary
from shardify.errors import InputError
from shardify.npy import npy_header
from shardify.splitindex import TokenInfo
from shardify.suggest import suggest_keywords
from shardify.tarfmt import BLOCK, ustar_header

__all__ = ["TokenOptions", "convert_tokens", "TokenRunner", "Tokenizer", "TOKENS_FIELD", "token_dtype"]

TOKENS_FIELD = "tokens.npy"
_FIELDS = (TOKENS_FIELD,)
_KEPT = 1 << 14
"""Document lengths a runner keeps a ``.npy`` header and a packer for (a few MB at most)."""
UINT16_IDS = 1 << 16

Tokenize = Callable[[str], Sequence[int]]


def token_dtype(vocab_size: int | None, eos: int | None) -> str:
    """``uint16`` when every id (vocabulary and EOS) is below 65,536, else ``uint32``."""
    if vocab_size is not None and vocab_size <= UINT16_IDS and (eos is None or eos < UINT16_IDS):
        return "uint16"
    return "uint32"


@suggest_keywords
@dataclass(frozen=True, kw_only=True)
class TokenOptions(ItemsOptions):
    """Options of :func:`convert_tokens`: those of :class:`ItemsOptions` plus the text and the ids."""

    column: str = "text"
    """The text column of a JSONL or Parquet file."""
    fmt: Literal["jsonl", "parquet"] | None = None
    """The file's format (None: from its extension)."""
    eos: int | None = None
    """Token id appended to every document (None: none)."""
    vocab_size: int | None = None
    """Ids a callable tokenizer returns are below this (None: uint32 storage, any id below 2**32);
    a Hugging Face tokenizer's own size is used when None."""
    chunk: int | None = 256
    chunk_size: int = 256
    """Texts per batch call of the tokenizer (and per worker task)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.eos is not None and self.eos < 0:
            raise ValueError(f"eos={self.eos} should be a token id >= 0")
        if self.vocab_size is not None and not 1 <= self.vocab_size <= 1 << 32:
            raise ValueError(f"vocab_size={self.vocab_size} should be in 1..2**32")
        if self.eos is not None and self.vocab_size is not None and self.eos >= self.vocab_size:
            raise ValueError(f"eos={self.eos} should be below vocab_size={self.vocab_size}")

    def shaping(self) -> dict[str, Any]:
        return {**super().shaping(), "column": self.column, "eos": self.eos, "vocab_size": self.vocab_size}


class Tokenizer:
    """A Hugging Face tokenizer (its JSON) or a callable, loaded once per process; picklable.

    ``path``: a ``tokenizer.json``; ``json``: its text; ``fn``: ``str -> list[int]``.
    """

    def __init__(self, *, json: str | None = None, fn: Tokenize | None = None, name: str = "") -> None:
        if (json is None) == (fn is None):
            raise ValueError("a Tokenizer takes one of json= and fn=")
        self.json, self.fn, self.name = json, fn, name
        self._hf: Any = None
        self._pid = -1

    @classmethod
    def of(cls, tokenizer: str | os.PathLike[str] | Tokenize | Any) -> Tokenizer:
        """From a ``tokenizer.json`` path, a ``tokenizers.Tokenizer``, a callable or the name of one
        (``MODULE:FUNCTION``, a string that is not a file)."""
        if isinstance(tokenizer, Tokenizer):
            return tokenizer
        if isinstance(tokenizer, str) and ":" in tokenizer and not os.path.exists(tokenizer):
            tokenizer = cast(Tokenize, load_function(tokenizer))
        if isinstance(tokenizer, (str, os.PathLike)):
            path = os.fspath(tokenizer)
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                raise InputError(f"cannot read the tokenizer: {e.strerror or e}", path=path) from e
            tok = cls(json=text, name=os.path.basename(path))
            tok.load()  # a bad file fails here, naming it, not in every worker
            return tok
        if type(tokenizer).__module__.startswith("tokenizers") and hasattr(tokenizer, "to_str"):
            return cls(json=tokenizer.to_str(), name="tokenizers.Tokenizer")
        if callable(tokenizer):
            target = getattr(tokenizer, "func", tokenizer)
            return cls(
                fn=tokenizer, name=f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', '?')}"
            )
        raise TypeError(
            f"tokenizer should be a tokenizer.json path, a tokenizers.Tokenizer or a callable, found {tokenizer!r}"
        )

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_hf": None, "_pid": -1}

    def load(self) -> Any:
        """The Hugging Face tokenizer of this process (loaded on first use in each process)."""
        if self._pid != os.getpid():
            try:
                from tokenizers import Tokenizer as HFTokenizer  # deferred: the optional 'tokens' extra
            except ImportError as e:
                raise InputError(
                    "a tokenizer.json needs the tokenizers package: pip install 'shardify[tokens]'", path=self.name
                ) from e
            try:
                self._hf = HFTokenizer.from_str(self.json or "")
            except Exception as e:  # noqa: BLE001 - the library raises a bare Exception for bad JSON
                raise InputError(f"not a tokenizers tokenizer: {e}", path=self.name) from e
            self._pid = os.getpid()
        return self._hf

    @property
    def vocab_size(self) -> int | None:
        return None if self.json is None else int(self.load().get_vocab_size(with_added_tokens=True))

    def digest(self) -> str:
        """What makes this tokenizer's ids: its JSON, or the callable's name and bytecode."""
        h = hashlib.sha256(self.name.encode())
        if self.json is not None:
            h.update(self.json.encode())
        else:
            code = getattr(getattr(self.fn, "func", self.fn), "__code__", None)
            h.update(code.co_code if code is not None else b"")
        return h.hexdigest()

    def encode(self, texts: list[str]) -> list[Sequence[int] | str]:
        """Each text's ids, or why it has none (``"tokenizer raised ValueError: ..."``)."""
        if self.fn is not None:
            return [self._call(self.fn, text) for text in texts]
        tok = self.load()
        batch = getattr(tok, "encode_batch_fast", tok.encode_batch)
        try:
            return [e.ids for e in batch(texts)]
        except Exception:  # noqa: BLE001 - one bad text fails the batch: find it, text by text
            return [self._call(lambda t: tok.encode(t).ids, text) for text in texts]

    @staticmethod
    def _call(fn: Tokenize, text: str) -> Sequence[int] | str:
        try:
            return fn(text)
        except Exception as e:  # noqa: BLE001 - reported as the row's error
            message = str(e).strip().splitlines()
            return f"tokenizer raised {type(e).__name__}: {message[0][:300] if message else '(no message)'}"


class TokenRunner(ChunkRunner):
    """Tokenizes a chunk of texts in one batch and encodes each document's ids as a sample."""

    def __init__(
        self, tokenizer: Tokenizer, *, dtype: str, limit: int, eos: int | None, check: bool, framed: bool = True
    ) -> None:
        super().__init__(_no_fn, ValueOptions(), ())
        self.tokenizer, self.dtype, self.limit, self.eos, self.check = tokenizer, np.dtype(dtype), limit, eos, check
        self.descr = repr(self.dtype.newbyteorder("<").str)
        self.unframed = None if framed else TOKENS_FIELD  # a chunked split takes each document's .npy as is
        self._code = "H" if self.dtype.itemsize == 2 else "I"
        self._eos_bytes = b"" if eos is None else np.asarray([eos], dtype=self.dtype.newbyteorder("<")).tobytes()
        self._headers: dict[int, bytes] = {}
        self._packers: dict[int, struct.Struct] = {}
        """``.npy`` headers and packers by document length: a corpus has a few hundred lengths."""

    def run(self, chunk: ItemChunk) -> tuple[list[Outcome], list[bytes]]:
        at = [j for j, item in enumerate(chunk.items) if isinstance(item, str) and item]  # the texts to encode
        ids: list[Sequence[int] | str | None] = [None] * len(chunk.items)
        for j, got in zip(at, self.tokenizer.encode([chunk.items[j] for j in at]) if at else [], strict=True):
            ids[j] = got
        parts: list[bytes] = []
        if not self.check:
            return self._trusted(chunk, ids, parts), parts
        outcomes = [
            self._outcome(index, item, ids[j], parts) for j, (index, item) in enumerate(zip(chunk.indexes, chunk.items))
        ]
        return outcomes, parts

    def _trusted(self, chunk: ItemChunk, ids: list[Sequence[int] | str | None], parts: list[bytes]) -> list[Outcome]:
        """:meth:`_outcome` for a chunk of ids that need no check (a ``tokenizers`` tokenizer's,
        within its vocabulary): each document's ``.npy`` is its header, its ids packed by one
        ``struct.Struct`` call and the EOS id's bytes (headers and packers kept by length: a
        third of the cost of converting the chunk's ids in numpy and slicing them out)."""
        outcomes: list[Outcome] = []
        tail, extra, packers, headers = self._eos_bytes, self.eos is not None, self._packers, self._headers
        for index, item, got in zip(chunk.indexes, chunk.items, ids, strict=True):
            if not (isinstance(got, list) and got):
                outcomes.append(self._outcome(index, item, got, parts))
                continue
            n = len(got)
            packer, header = packers.get(n), headers.get(n + extra)  # the methods' lookups, inlined
            packed = (packer or self._packer(n)).pack(*got)
            outcomes.append(self._member(index, (header or self._header(n + extra)) + packed + tail, n + extra, parts))
        return outcomes

    def _packer(self, n: int) -> struct.Struct:
        """Packs ``n`` ids as little-endian ``dtype``."""
        packer = self._packers.get(n)
        if packer is None:
            packer = struct.Struct(f"<{n}{self._code}")
            if len(self._packers) < _KEPT:
                self._packers[n] = packer
        return packer

    def _header(self, n: int) -> bytes:
        """The ``.npy`` header of a document of ``n`` tokens."""
        header = self._headers.get(n)
        if header is None:
            header = npy_header(self.descr, (n,))
            if len(self._headers) < _KEPT:
                self._headers[n] = header
        return header

    def one(self, index: int, item: Any, parts: list[bytes]) -> Outcome:
        outcomes, mine = self.run(ItemChunk(start=0, indexes=(index,), items=(item,)))
        parts += mine
        return outcomes[0]

    def _outcome(self, index: int, item: Any, ids: Sequence[int] | str | None, parts: list[bytes]) -> Outcome:
        if ids is None:
            return Outcome(error=_not_text(item))
        if isinstance(ids, str):
            return Outcome(error=ids)
        try:
            array = self._array(ids)
        except (TypeError, ValueError, OverflowError) as e:
            return Outcome(error=f"tokenizer returned {str(e)[:300]}")
        if len(ids) == 0:
            return Outcome(error="no tokens")
        return self._member(index, npy_header(self.descr, array.shape) + array.tobytes(), int(array.size), parts)

    def _member(self, index: int, data: bytes, tokens: int, parts: list[bytes]) -> Outcome:
        """One document's ``.npy`` bytes as its sample: framed as its tar member, or as they are
        (:attr:`unframed`)."""
        key = f"{index:09d}"  # digits only: a valid key, so the member is encoded here without member_parts' checks
        if self.unframed is not None:
            parts.append(data)
            return Outcome(key=key, fields=_FIELDS, size=len(data), tokens=tokens)
        pad = -len(data) % BLOCK
        parts += (ustar_header(f"{key}.{TOKENS_FIELD}", len(data)), data, bytes(pad))
        return Outcome(key=key, fields=_FIELDS, size=BLOCK + len(data) + pad, tokens=tokens)

    def _array(self, ids: Sequence[int]) -> np.ndarray:
        n = len(ids)
        array = np.empty(n + (self.eos is not None), dtype=self.dtype)
        if self.check:
            wide = np.asarray(ids, dtype=np.int64)
            if wide.ndim != 1:
                raise ValueError(f"ids of shape {wide.shape}, not a list of ints")
            if n and (int(wide.min()) < 0 or int(wide.max()) >= self.limit):
                bad = int(wide.min()) if int(wide.min()) < 0 else int(wide.max())
                raise ValueError(f"token id {bad}, outside 0..{self.limit - 1}")
            array[:n] = wide
        else:
            array[:n] = ids
        if self.eos is not None:
            array[n] = self.eos
        return array


def _no_fn(item: Any) -> None:  # pragma: no cover - TokenRunner replaces every use of fn
    raise RuntimeError("TokenRunner has no per-item function")


def _not_text(item: Any) -> str:
    if isinstance(item, MissingText):
        return item.reason
    if isinstance(item, str):
        return "empty text"
    return f"not text: a {type(item).__name__}"


def convert_tokens(
    src: str | os.PathLike[str] | Iterable[Any],
    out: str | os.PathLike[str],
    *,
    tokenizer: str | os.PathLike[str] | Tokenize | Any,
    options: TokenOptions | None = None,
    **overrides: Any,
) -> SplitSummary:
    """Tokenize the texts of ``src`` into split ``split`` of ``out``; return the summary.

    ``src``: a JSONL or Parquet file (its ``column``), or texts (re-iterable, in the same order,
    to resume). ``tokenizer``: a ``tokenizer.json`` path, a ``tokenizers.Tokenizer`` or a callable
    ``str -> list[int]``. Options are :class:`TokenOptions` fields, as keywords or ``options=``.
    """
    o = replace(options or TokenOptions(), **overrides)
    tok = Tokenizer.of(tokenizer)
    items: Iterable[Any] = TextRows(src, o.column, o.fmt) if isinstance(src, (str, os.PathLike)) else src
    vocab = o.vocab_size if o.vocab_size is not None else tok.vocab_size
    if o.eos is not None and vocab is not None and o.eos >= vocab:
        raise ValueError(f"eos={o.eos} should be below the tokenizer's vocabulary size {vocab}")
    dtype = token_dtype(vocab, o.eos)
    limit = vocab if vocab is not None else 1 << 32
    check = tok.fn is not None or o.vocab_size is not None
    runner = TokenRunner(tok, dtype=dtype, limit=limit, eos=o.eos, check=check, framed=o.chunk is None)
    info = TokenInfo(field=TOKENS_FIELD, dtype=dtype, vocab_size=vocab, eos=o.eos)
    count = len(items) if isinstance(items, Sized) else None
    fp = fingerprint(options=o.shaping(), tokens=info.to_json(), tokenizer=tok.digest(), count=count).hexdigest()
    spec = RunSpec(runner=runner, source=f"tokens:{tok.name}", noun="row", reason="", tokens=info, index_keys=True)
    return run_items(items, spec, out, o, str(fp))
