"""Sample: decode fields by extension, augment (``transforms``), process each sample into its output
and collate samples into batches."""
