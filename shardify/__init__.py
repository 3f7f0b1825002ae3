"""shardify: pack datasets into deterministic tar shards and stream them into PyTorch.

``shardify`` itself holds the shard format shared by both sides: key rules
(:mod:`shardify.keys`), the tar layout (:mod:`shardify.tarfmt`, :mod:`shardify.tario`) and
the manifest (:mod:`shardify.manifest`). ``shardify.convert`` writes, ``shardify.reader``
reads. Importing this package does not import torch.
"""

from __future__ import annotations

__all__ = ["__version__", "FORMAT_VERSION", "CHUNKED_FORMAT_VERSION"]

__version__ = "0.1.0"
FORMAT_VERSION = 2
"""Version of the shard layout and manifest schema; readers refuse newer versions.

1: shards `{split}-{index:06d}.tar`, index `{split}.json`, and every sample has a
``{key}.json`` member. 2: every conversion has a version token in its file names
(`{split}-{version}-{index:06d}.tar`, `{split}-{version}.json`) and the manifest names each
split's version; ``{key}.json`` only where it holds something the key, the other members
and the split index do not (see docs/format.md). A version-2 reader reads version 1 unchanged."""
CHUNKED_FORMAT_VERSION = 3
"""Format version of a split written in the chunked layout (``chunk=N``, see
:mod:`shardify.chunk`): its index says ``format_version`` 3 and ``chunk``, so a reader that
reads only 1..2 refuses it by name. Per-sample splits stay version 2, byte for byte."""
