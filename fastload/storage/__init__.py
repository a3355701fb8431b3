"""Converted datasets as stored: opening one (local or at a URL), mixtures, sample tables, remote
reads and the shard cache, verification and the inspect summary."""
