"""``python -m shardify.convert``: the same as the ``shardify`` command."""

from shardify.convert.cli import entrypoint

entrypoint()
