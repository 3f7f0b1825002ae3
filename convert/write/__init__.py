"""Write: plan which samples go in which shard, write shards (local processes or Ray) into a
local folder or an fsspec URL, version them, and finish a split (report, index, manifest),
all within one conversion session (``session.ConversionSession``) whatever the way in."""
