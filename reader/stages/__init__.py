"""The reader's stages: small iterators over their source, each saving and restoring its place.

``Read -> Shuffle -> Process (decode, augment) -> Batch -> Collate -> Transport`` run in each
worker; ``DevicePrefetch`` in the training process. Every stage follows :class:`Stage`.
"""
