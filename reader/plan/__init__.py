"""Plan: which samples each rank and worker reads, in which order, as pure functions of
(seed, epoch, rank, world, worker, workers, shard sizes): ``mix`` builds the epoch's sequence
(streams, epoch size, blocks), ``assign`` cuts it per rank and worker, ``shuffle`` orders a
worker's share, ``resume`` replans what a run on another topology left, ``simulate`` shows
what a rank yields; ``world`` is the one place that reads rank and world from torch."""
