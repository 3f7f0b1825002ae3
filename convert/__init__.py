"""The writer side: plan, pack and verify shards; the ``shardify`` command line."""
