"""The training side: stream shards into a PyTorch training loop."""
