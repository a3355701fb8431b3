"""The on-disk contract: the index (``index``), the layouts (``shard_formats``: a folder each), a
reader's shape (``shard_reader``) and a shard's files (``shard_files``: names, confinement under the
dataset root, opening; the confined open itself is ``fastload._util.files.open_in_root``)."""
