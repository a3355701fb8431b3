"""CIFAR-10 / CIFAR-100 "python version" batches, parsed without arbitrary-code unpickling."""

from __future__ import annotations

import codecs
import functools
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastload.converters.sample import Sample, SourceItem, file_stamp, make_key, unique_keys
from fastload.converters.sources import SourceOptions, inside_source

# The only globals a CIFAR batch references: how numpy rebuilds an array and its dtype, and how
# protocol-2 pickles written by Python 3 spell a bytes object. None of them can run code.
_ALLOWED_GLOBALS = {
    ("_codecs", "encode"): codecs.encode,
    ("numpy.core.multiarray", "_reconstruct"): np.ndarray.__reduce__(np.zeros(1))[0],
    ("numpy._core.multiarray", "_reconstruct"): np.ndarray.__reduce__(np.zeros(1))[0],
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}

_SPLITS = {
    "cifar10": {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]},
    "cifar100": {"train": ["train"], "test": ["test"]},
}


class _Refused(pickle.UnpicklingError):
    """A global the CIFAR unpickler does not admit (named in the message)."""


class _CifarUnpickler(pickle.Unpickler):
    """Admits only numpy array reconstruction; anything else in the file is refused."""

    def find_class(self, module: str, name: str) -> object:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise _Refused(f"refusing to load {module}.{name} from a CIFAR file") from None


def read_cifar_pickle(path: Path) -> dict:
    """Load one CIFAR pickle safely, with byte-string keys decoded to str."""
    with open(path, "rb") as f:
        try:
            data = _CifarUnpickler(f, encoding="bytes").load()
        except _Refused as exc:
            raise ValueError(f"{path}: {exc}") from None
        except Exception as exc:  # a damaged pickle raises many kinds (UnpicklingError, EOFError, ValueError, KeyError, ...)
            raise ValueError(f"{path}: not a CIFAR file (its pickle does not load: {type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a CIFAR batch (top level is {type(data).__name__})")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in data.items()}


@functools.lru_cache(maxsize=2)
def _load_batch(path: Path) -> tuple[np.ndarray, list[int], list[str]]:
    batch = read_cifar_pickle(path)
    labels = batch.get("labels", batch.get("fine_labels"))
    if "data" not in batch or labels is None:
        raise ValueError(f"{path}: missing 'data' or 'labels' in CIFAR batch")
    try:
        data = np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in batch.get("filenames", [])]
        label_list = [int(v) for v in labels]
    except (TypeError, ValueError, UnicodeDecodeError):
        raise ValueError(f"{path}: not a CIFAR batch ('data' is not rows of 3072 bytes, or 'labels' not integers)") from None
    if len(label_list) != len(data):
        raise ValueError(f"{path}: {len(data)} images but {len(label_list)} labels")
    return np.ascontiguousarray(data), label_list, names


@dataclass(frozen=True)
class CifarSource:
    """The batches of one split; images are 32x32 RGB arrays."""

    files: tuple[Path, ...]
    classes: tuple[str, ...] | None

    def items(self) -> list[SourceItem]:
        """Every image of every batch file, in file order."""
        refs, names, stamps = [], [], {path: file_stamp(path) for path in self.files}
        for path in self.files:
            data, _, filenames = _load_batch(path)
            for row in range(len(data)):
                refs.append((path, row))
                names.append(filenames[row] if row < len(filenames) else f"{path.name}_{row:05d}")
        keys = unique_keys([make_key(n) for n in names])
        return [
            SourceItem(key=k, where=f"{p}#{row}", size_hint=2200, ref=(p, row), stamp=stamps[p]) for k, (p, row) in zip(keys, refs)
        ]

    def load(self, item: SourceItem) -> Sample:
        """The row's pixels and label."""
        path, row = item.ref
        data, labels, _ = _load_batch(path)
        return Sample(key=item.key, where=item.where, image=data[row], label=labels[row])


def open_source(path: str, options: SourceOptions) -> CifarSource:
    """Open an extracted ``cifar-10-batches-py`` or ``cifar-100-python`` directory."""
    root = Path(path)
    for variant, meta_name, names_key in (("cifar10", "batches.meta", "label_names"), ("cifar100", "meta", "fine_label_names")):
        files = [root / name for name in _SPLITS[variant][options.split]]
        if all(f.is_file() for f in files):
            for f in [*files, root / meta_name]:
                inside_source(root, f, options.follow_symlinks)
            meta = root / meta_name
            classes = None
            if meta.is_file():
                names = read_cifar_pickle(meta).get(names_key)
                if not isinstance(names, list):
                    raise ValueError(f"{meta}: no {names_key} list of class names")
                classes = tuple(n.decode(errors="replace") if isinstance(n, bytes) else str(n) for n in names)
            return CifarSource(files=tuple(files), classes=classes)
    raise FileNotFoundError(
        f"{path}: no CIFAR {options.split} batches (expected data_batch_1..5/test_batch or train/test)"
    )
