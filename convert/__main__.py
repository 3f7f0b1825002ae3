"""``python -m shardify.convert``: the same as the ``shardify`` command (:mod:`shardify.cli`)."""

from shardify.cli.__main__ import entrypoint

entrypoint()
