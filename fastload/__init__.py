"""fastload: fast data loading for PyTorch training.

Heavy parts (torch, the loader) are imported on first use, so ``fastload convert`` starts fast; a
type checker reads the same names from the imports under ``TYPE_CHECKING`` (the package ships
``py.typed``).
"""

from __future__ import annotations

import warnings
from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from fastload import transforms
    from fastload.av.clips import Clip
    from fastload.av.crops import Audio
    from fastload.errors import DatasetIndexError, FastloadError, RemoteError, SampleError, ShardError
    from fastload.formats.index import DatasetIndex, read_index
    from fastload.formats.shard_info import ShardInfo
    from fastload.loader import DataLoader
    from fastload.orders.schedule import WeightSchedule
    from fastload.storage.dataset import ShardedDataset, open
    from fastload.storage.mixed_dataset import MixedDataset, mix
    from fastload.storage.verify import verify_dataset

_EXPORTS = {
    "DataLoader": "fastload.loader",
    "open": "fastload.storage.dataset",
    "ShardedDataset": "fastload.storage.dataset",
    "mix": "fastload.storage.mixed_dataset",
    "MixedDataset": "fastload.storage.mixed_dataset",
    "WeightSchedule": "fastload.orders.schedule",
    "transforms": "fastload.transforms",
    "Clip": "fastload.av.clips",
    "Audio": "fastload.av.crops",
    "DatasetIndex": "fastload.formats.index",
    "ShardInfo": "fastload.formats.shard_info",
    "read_index": "fastload.formats.index",
    "verify_dataset": "fastload.storage.verify",
    "FastloadError": "fastload.errors",
    "SampleError": "fastload.errors",
    "ShardError": "fastload.errors",
    "DatasetIndexError": "fastload.errors",
    "RemoteError": "fastload.errors",
}
_DEPRECATED = {"TokenDataLoader": ("DataLoader", "fastload.DataLoader(dataset, seq_len=...) is the token loader now")}

__all__ = [  # _EXPORTS' names, spelled out for type checkers (tests/text/test_one_loader.py checks they agree)
    "Audio",
    "Clip",
    "DataLoader",
    "DatasetIndex",
    "DatasetIndexError",
    "FastloadError",
    "MixedDataset",
    "RemoteError",
    "SampleError",
    "ShardError",
    "ShardInfo",
    "ShardedDataset",
    "WeightSchedule",
    "__version__",
    "mix",
    "open",
    "read_index",
    "transforms",
    "verify_dataset",
]


def __getattr__(name: str) -> Any:
    if name == "transforms":
        return import_module("fastload.transforms")
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    if name in _DEPRECATED:  # kept for one release (CHANGELOG.md)
        target, why = _DEPRECATED[name]
        warnings.warn(f"fastload.{name} is deprecated and will be removed in the next release: {why}", DeprecationWarning, stacklevel=2)
        return __getattr__(target)
    raise AttributeError(f"module 'fastload' has no attribute {name!r}")
