"""I/O: resolve a dataset or shard list to shards (``sources``), fetch remote shards
(``remote``, ``cache``) and read a shard's samples as encoded bytes (``stream``)."""
