"""WebDataset tar shards with reproducible bytes and a DALI ``.idx`` index written in the same pass."""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path
from typing import BinaryIO

from fastload._util.files import temporary_beside
from fastload.fields import LABEL_FIELD, format_label
from fastload.formats.idx import Member, format_dali_index
from fastload.formats.shard_info import ShardInfo
from fastload.formats.table import TABLE_SUFFIX, Facts, tar_table
from fastload.formats.writing import PreparedSample, WriterOptions, publish, write_beside

BLOCK = tarfile.BLOCKSIZE
RECORD = tarfile.RECORDSIZE


def _ustar_template() -> tuple[bytes, int]:
    """A ustar header with every fixed field filled in, and the byte sum of those fields."""
    header = bytearray(BLOCK)
    header[100:124] = b"0000644\x000000000\x000000000\x00"  # mode, uid, gid
    header[136:148] = b"00000000000\x00"  # mtime
    header[148:156] = b"        "  # the checksum field counts as spaces while summing
    header[156:157] = b"0"  # regular file
    header[257:265] = b"ustar\x0000"
    header[329:345] = b"0000000\x000000000\x00"  # device numbers
    return bytes(header), sum(header)


_USTAR, _USTAR_SUM = _ustar_template()


def member_header(name: str, size: int) -> bytes:
    """The tar header of a regular file with fixed metadata (mtime 0, uid/gid 0, mode 0644).

    Short names get a POSIX ustar header built from a template (tarfile's generic code costs
    ~50 us per member, a third of a conversion's time); long names and huge files go through
    tarfile's GNU format.
    """
    encoded = name.encode()
    if len(encoded) > 100 or size >= 8**11:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode, info.uname, info.gname = size, 0, 0o644, "", ""
        return info.tobuf(format=tarfile.GNU_FORMAT, encoding="utf-8", errors="strict")
    size_field = b"%011o\x00" % size
    checksum = _USTAR_SUM + sum(encoded) + sum(size_field)
    return b"".join(
        (encoded, bytes(100 - len(encoded)), _USTAR[100:124], size_field, _USTAR[136:148],
         b"%06o\x00 " % checksum, _USTAR[156:])
    )


class WdsShardWriter:
    """Writes members with fixed metadata (mtime 0, uid/gid 0, mode 0644) in the order given."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.idx_path = path.with_suffix(".idx")
        self.table_path = path.with_suffix(TABLE_SUFFIX)
        fd, self._tmp = temporary_beside(path)
        self._file: BinaryIO = os.fdopen(fd, "wb", buffering=1 << 20)  # open across add() calls, closed by finish()/abort()
        self._sha = hashlib.sha256()
        self._pos = 0
        self._samples: list[list[Member]] = []
        self._facts: list[Facts] = []

    def _write(self, data: bytes) -> None:
        self._file.write(data)
        self._sha.update(data)
        self._pos += len(data)

    def add(self, sample: PreparedSample) -> None:
        """Write the sample's members, sorted by extension, and remember their offsets."""
        if sample.image is not None and not isinstance(sample.image, bytes):
            raise TypeError(f"{sample.key}: tar shards store encoded images, got {type(sample.image).__name__}")
        fields = dict(sample.extra)
        if sample.image_field is not None and isinstance(sample.image, bytes):
            fields[sample.image_field] = sample.image
        if sample.label is not None:
            fields[LABEL_FIELD] = format_label(sample.label)
        members, parts, pos = [], [], self._pos
        for ext in sorted(fields):
            name, data = f"{sample.key}.{ext}", fields[ext]
            header = member_header(name, len(data))
            pos += len(header)
            members.append((ext, pos, len(data), name))
            padding = -len(data) % BLOCK
            parts += [header, data, b"\0" * padding]
            pos += len(data) + padding
        self._write(b"".join(parts))  # one write and one hash update per sample
        self._samples.append(members)
        self._facts.append(sample.facts)

    def finish(self) -> ShardInfo:
        """End the archive (two zero blocks, padded to a 10 KiB record), then publish idx, sample
        table and tar."""
        self._write(b"\0" * (2 * BLOCK))
        if self._pos % RECORD:
            self._write(b"\0" * (RECORD - self._pos % RECORD))
        self._file.close()
        idx_bytes = format_dali_index(self._samples)
        publish(write_beside(self.idx_path, idx_bytes), self.idx_path)
        table_bytes = tar_table(self._tmp, self._samples, self._facts)
        publish(write_beside(self.table_path, table_bytes), self.table_path)
        publish(self._tmp, self.path)
        return ShardInfo(
            path=self.path.name,
            samples=len(self._samples),
            bytes=self._pos,
            sha256=self._sha.hexdigest(),
            offsets=self.idx_path.name,
            offsets_sha256=hashlib.sha256(idx_bytes).hexdigest(),
            table=self.table_path.name,
            table_sha256=hashlib.sha256(table_bytes).hexdigest(),
        )

    def abort(self) -> None:
        """Close and delete the temporary file."""
        self._file.close()
        self._tmp.unlink(missing_ok=True)


def open_writer(path: Path, options: WriterOptions) -> WdsShardWriter:
    """A tar shard writer (the WebDataset layout has no options)."""
    return WdsShardWriter(path)
