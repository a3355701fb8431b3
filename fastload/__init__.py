"""fastload: fast data loading for PyTorch training.

Heavy parts (torch, the loader) are imported on first use, so ``fastload convert`` starts fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "DataLoader": "fastload.loader",
    "TokenDataLoader": "fastload.token_loader",
    "open": "fastload.storage.dataset",
    "ShardedDataset": "fastload.storage.dataset",
    "mix": "fastload.storage.mixture",
    "MixedDataset": "fastload.storage.mixture",
    "WeightSchedule": "fastload.orders.schedule",
    "transforms": "fastload.transforms",
    "Clip": "fastload.av.clips",
    "Audio": "fastload.av.crops",
    "DatasetIndex": "fastload.formats.index",
    "ShardInfo": "fastload.formats.index",
    "read_index": "fastload.formats.index",
    "verify_dataset": "fastload.storage.verify",
    "FastloadError": "fastload.errors",
    "SampleError": "fastload.errors",
    "ShardError": "fastload.errors",
    "DatasetIndexError": "fastload.errors",
    "RemoteError": "fastload.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name == "transforms":
        return import_module("fastload.transforms")
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fastload' has no attribute {name!r}")
