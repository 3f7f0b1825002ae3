"""Sample: decode fields by extension, augment (``transforms``), run the per-sample pipeline
and collate samples into batches."""
