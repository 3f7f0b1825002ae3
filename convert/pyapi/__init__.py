"""From Python: encode values by field (``values``), write a split sample by sample
(``pywriter.ShardWriter``), or map a user function over items in parallel
(``items.convert_items``); both end in the same finish path as the CLI converters."""
