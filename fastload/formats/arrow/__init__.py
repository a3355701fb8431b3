"""Layout ``arrow``: Arrow IPC stream files (``datasets.save_to_disk``) read in place (a record batch a shard)."""
