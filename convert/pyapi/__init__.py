"""From Python: encode values by field (``values``), write a split sample by sample
(``pywriter.ShardWriter``), or map a user function over items in parallel
(``items.convert_items``); both drive the same conversion session as the CLI converters
(:class:`~shardify.convert.write.session.ConversionSession`)."""
