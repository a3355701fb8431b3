"""The on-disk contract: the index (``index``), the layouts (``shard_formats``: a folder each), a
reader's shape (``shard_reader``) and a shard's files (``shard_files``: names, confinement under the
dataset root, opening; the confined open itself is ``fastload._util.files.open_in_root``). The names
below are handed on from those modules."""

from fastload._util.files import inside_root, open_in_root, this_process
from fastload.formats.shard_files import (
    dataset_file,
    dataset_path,
    offsets_name,
    open_shard,
    open_shard_files,
    root_file,
    table_name,
)
from fastload.formats.shard_reader import PixelReader, ShardReader

__all__ = [
    "PixelReader", "ShardReader", "dataset_file", "dataset_path", "inside_root", "offsets_name", "open_in_root",
    "open_shard", "open_shard_files", "root_file", "table_name", "this_process",
]
