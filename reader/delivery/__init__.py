"""Delivery: move batches from workers to the training loop (shared-memory slots, the
DataLoader wrapper with exact ``state_dict``, device prefetch) and report skipped samples."""
