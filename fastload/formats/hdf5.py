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
        self._keys: list[str] | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_file"], state["_pid"] = None, -1
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

    def __len__(self) -> int:
        return len(self._h5()["key"])

    def key(self, i: int) -> str:
        """The key of row ``i``."""
        if self._keys is None:
            self._keys = [k.decode() if isinstance(k, bytes) else k for k in self._h5()["key"][:]]
        return self._keys[i]

    @property
    def decoded(self) -> bool:
        """Whether the shard stores decoded pixels rather than encoded images."""
        return "pixels" in self._h5()

    def pixels(self, i: int) -> np.ndarray:
        """Decoded HWC uint8 pixels of row ``i`` (decoded shards only)."""
        return self._h5()["pixels"][i]

    def read(self, i: int) -> dict[str, bytes]:
        """Encoded fields of row ``i``: the image under its format's extension, ``cls``, extras."""
        f = self._h5()
        out: dict[str, bytes] = {}
        if "image" in f:
            fmt = f["image_format"][i]
            out[fmt.decode() if isinstance(fmt, bytes) else fmt] = f["image"][i].tobytes()
        if "cls" in f:
            out["cls"] = str(int(f["cls"][i])).encode()
        for ext, column in f.get("extra", {}).items():
            out[ext] = column[i].tobytes()
        return out

    def close(self) -> None:
        """Close the file of this process."""
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None
