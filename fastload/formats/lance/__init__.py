"""Layout ``lance``: a Lance dataset read in place (a slice of a fragment's rows a shard)."""
