"""The CPU engine: forked worker processes that decode and transform batches into shared slots."""
