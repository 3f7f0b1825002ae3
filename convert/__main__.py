"""``python -m shardify.convert``: the same as the ``shardify`` command (:mod:`shardify.cli`)."""

from shardify.cli.__main__ import entrypoint

if __name__ == "__main__":  # imported (by a tool that walks the package), it runs nothing
    entrypoint()
