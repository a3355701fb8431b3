"""Tar shards read by offset: the DALI ``.idx`` beside each shard gives every member's position,
so reading a sample is one ``pread`` per field, with no tar parsing."""

from __future__ import annotations

import os
from pathlib import Path

from fastload.errors import ShardError
from fastload.index import DatasetIndexError, parse_dali_index


MAX_GAP = 4096  # read a sample's fields in one pread when they are at most this far apart in all


class TarShardReader:
    """Random access to the samples of one tar shard."""

    def __init__(self, path: Path, idx_path: Path) -> None:
        self.path = path
        try:
            text = idx_path.read_text()
        except OSError as exc:
            raise ShardError(f"{idx_path}: cannot read the shard's offset index ({exc.strerror})") from None
        try:
            self._samples = parse_dali_index(text, str(idx_path))
        except DatasetIndexError as exc:
            raise ShardError(str(exc)) from None
        self._fd: int | None = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self._samples)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fd"], state["_pid"] = None, -1
        return state

    def _descriptor(self) -> int:
        if self._fd is None or self._pid != os.getpid():  # never share a descriptor across a fork
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except OSError as exc:
                raise ShardError(f"{self.path}: cannot open shard ({exc.strerror})") from None
            self._pid = os.getpid()
        return self._fd

    def open(self) -> None:
        """Open the shard's descriptor in this process now."""
        self._descriptor()

    def key(self, i: int) -> str:
        """The key of sample ``i``."""
        return self._samples.key(i)

    def spans(self, i: int) -> dict[str, tuple[int, int]]:
        """Each field's (data offset, size) for sample ``i``."""
        return self._samples.spans(i)

    def read(self, i: int) -> dict[str, bytes]:
        """Every field of sample ``i``: one ``pread`` over all of them (a sample's members are
        neighbours in the tar, a tar header apart), else one per field."""
        fd = self._descriptor()
        spans = self._samples.spans(i)
        start = min(offset for offset, _ in spans.values())
        end = max(offset + size for offset, size in spans.values())
        if end - start <= sum(size for _, size in spans.values()) + MAX_GAP:
            block = os.pread(fd, end - start, start)
            if len(block) == end - start:
                return {ext: block[offset - start : offset - start + size] for ext, (offset, size) in spans.items()}
        out = {}
        for ext, (offset, size) in spans.items():
            data = os.pread(fd, size, offset)
            if len(data) != size:
                raise ShardError(f"{self.path}: sample {self.key(i)!r} field {ext} is cut short (shard truncated?)")
            out[ext] = data
        return out

    def close(self) -> None:
        """Close the descriptor of this process."""
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None
