"""Plan: which samples each rank and worker reads, in which order, as pure functions of
(seed, epoch, rank, world, worker, workers, shard sizes); ``world`` is the one place that
reads rank and world from torch."""
