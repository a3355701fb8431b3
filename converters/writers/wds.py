"""WebDataset tar shards with reproducible bytes and a DALI ``.idx`` index written in the same pass."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path
from typing import BinaryIO

from converters.writers import PreparedSample, WriterOptions, publish, temp_path
from fastload.index import Member, ShardInfo, format_dali_index

BLOCK = tarfile.BLOCKSIZE
RECORD = tarfile.RECORDSIZE


class WdsShardWriter:
    """Writes members with fixed metadata (mtime 0, uid/gid 0, mode 0644) in the order given."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.idx_path = path.with_suffix(".idx")
        self._tmp = temp_path(path)
        self._file: BinaryIO = open(self._tmp, "wb")
        self._sha = hashlib.sha256()
        self._pos = 0
        self._samples: list[list[Member]] = []

    def _write(self, data: bytes) -> None:
        self._file.write(data)
        self._sha.update(data)
        self._pos += len(data)

    def _add_member(self, name: str, data: bytes) -> int:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        self._write(info.tobuf(format=tarfile.GNU_FORMAT, encoding="utf-8", errors="strict"))
        offset = self._pos
        self._write(data)
        if len(data) % BLOCK:
            self._write(b"\0" * (BLOCK - len(data) % BLOCK))
        return offset

    def add(self, sample: PreparedSample) -> None:
        """Write the sample's members, sorted by extension, and remember their offsets."""
        if not isinstance(sample.image, bytes):
            raise TypeError(f"{sample.key}: tar shards store encoded images, got {type(sample.image).__name__}")
        fields = dict(sample.extra)
        fields[sample.image_field] = sample.image
        if sample.label is not None:
            fields["cls"] = str(sample.label).encode()
        members = []
        for ext in sorted(fields):
            name = f"{sample.key}.{ext}"
            offset = self._add_member(name, fields[ext])
            members.append((ext, offset, len(fields[ext]), name))
        self._samples.append(members)

    def finish(self) -> ShardInfo:
        """End the archive (two zero blocks, padded to a 10 KiB record), then publish tar and idx."""
        self._write(b"\0" * (2 * BLOCK))
        if self._pos % RECORD:
            self._write(b"\0" * (RECORD - self._pos % RECORD))
        self._file.close()
        idx_tmp = temp_path(self.idx_path)
        idx_tmp.write_bytes(format_dali_index(self._samples))
        publish(idx_tmp, self.idx_path)
        publish(self._tmp, self.path)
        return ShardInfo(
            path=self.path.name,
            samples=len(self._samples),
            bytes=self._pos,
            sha256=self._sha.hexdigest(),
            offsets=self.idx_path.name,
        )

    def abort(self) -> None:
        """Close and delete the temporary file."""
        self._file.close()
        self._tmp.unlink(missing_ok=True)


def open_writer(path: Path, options: WriterOptions) -> WdsShardWriter:
    """A tar shard writer (the WebDataset layout has no options)."""
    return WdsShardWriter(path)
