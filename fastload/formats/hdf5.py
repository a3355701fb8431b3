"""HDF5 shards read by row: encoded images (``image``) or fixed-size pixels (``pixels``), labels
(``cls``), keys, and extra fields (``extra/EXT``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from fastload.errors import ShardError


class Hdf5ShardReader:
    """Random access to the rows of one HDF5 shard; the file opens lazily in each process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = None
        self._pid = -1
        self._cached: dict | None = None
        self._cached_pid = -1

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_file"], state["_pid"], state["_cached"] = None, -1, None
        return state

    def _h5(self):  # type: ignore[no-untyped-def]
        if self._file is None or self._pid != os.getpid():
            import h5py

            try:
                self._file = h5py.File(self.path, "r")
            except OSError as exc:
                raise ShardError(f"{self.path}: cannot open HDF5 shard ({exc})") from None
            self._pid = os.getpid()
        return self._file

    def open(self) -> None:
        """Open the file in this process now."""
        self._h5()

    def __len__(self) -> int:
        return len(self._h5()["key"])

    def _columns(self) -> dict:
        """Small per-row columns (keys, labels, image formats) read once; big ones as dataset handles."""
        if self._cached is None or self._cached_pid != os.getpid():
            f = self._h5()
            decode = lambda values: [v.decode() if isinstance(v, bytes) else v for v in values]  # noqa: E731
            self._cached = {
                "key": decode(f["key"][:]),
                "cls": f["cls"][:] if "cls" in f else None,
                "image_format": decode(f["image_format"][:]) if "image_format" in f else None,
                "image": f["image"] if "image" in f else None,
                "pixels": f["pixels"] if "pixels" in f else None,
                "extra": dict(f["extra"].items()) if "extra" in f else {},
            }
            self._cached_pid = os.getpid()
        return self._cached

    def key(self, i: int) -> str:
        """The key of row ``i``."""
        return self._columns()["key"][i]

    @property
    def decoded(self) -> bool:
        """Whether the shard stores decoded pixels rather than encoded images."""
        return self._columns()["pixels"] is not None

    def pixels(self, i: int) -> np.ndarray:
        """Decoded HWC uint8 pixels of row ``i`` (decoded shards only)."""
        return self._columns()["pixels"][i]

    def read(self, i: int) -> dict[str, bytes]:
        """Encoded fields of row ``i``: the image under its format's extension, ``cls``, extras."""
        columns = self._columns()
        out: dict[str, bytes] = {}
        if columns["image"] is not None:
            out[columns["image_format"][i]] = columns["image"][i].tobytes()
        if columns["cls"] is not None:
            out["cls"] = str(int(columns["cls"][i])).encode()
        for ext, column in columns["extra"].items():
            out[ext] = column[i].tobytes()
        return out

    def close(self) -> None:
        """Close the file of this process."""
        self._cached = None
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None
