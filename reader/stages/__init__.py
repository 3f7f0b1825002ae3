"""The reader's stages: small iterators over their source, each saving and restoring its place.

``Read -> Shuffle -> Process (decode, augment) -> Batch (Cut or Bucketed, then Fill) -> Collate
-> ToSharedMemory`` run in each worker (:func:`~shardify.reader.stages.chain.build_chain` builds
them from the worker's plan);
``DevicePrefetch`` in the training process. Every stage follows :class:`~shardify.reader.stages.base.Stage`.
"""
