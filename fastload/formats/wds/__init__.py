"""The wds shard layout: its reader and writer (README.md beside them: the files on disk)."""
