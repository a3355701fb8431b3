"""What every layout's shard writer shares (each layout's own is ``formats/NAME/writer.py``, named by
its row in fastload.formats.shard_formats). Each writes one shard to a temporary name and, on ``finish``, fsyncs and renames
it into place, returning the shard's index entry. Nothing is visible under the final name before.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fastload._util.files import temporary_beside
from fastload.formats.shard_formats import shard_format
from fastload.formats.shard_info import ShardInfo

if TYPE_CHECKING:
    import numpy as np

    from fastload.av.facts import MediaFacts

@dataclass
class PreparedSample:
    """A cleaned sample ready to write: the image under its field name (``jpg``, ``png``, or
    ``pixels`` for decoded HWC uint8) or none (``image_field`` None), an optional label, extra
    fields by extension."""

    key: str
    image_field: str | None
    image: bytes | np.ndarray | None
    label: int | None = None
    extra: dict[str, bytes] = field(default_factory=dict)
    facts: dict[str, MediaFacts] = field(default_factory=dict)  # each video or audio field's stream facts (for the sample table)


class ShardWriter(Protocol):
    """Collects one shard's samples and publishes the shard atomically."""

    def add(self, sample: PreparedSample) -> None:
        """Append one sample."""

    def finish(self) -> ShardInfo:
        """Flush, fsync and rename into place; return the shard's index entry."""

    def abort(self) -> None:
        """Remove temporary files after a failure."""


@dataclass(frozen=True)
class WriterOptions:
    """Layout-specific writer settings."""

    hdf5_decoded: bool = False  # store uint8[N,H,W,C] pixels instead of encoded bytes
    hdf5_compression: str | None = None  # "gzip" | "lzf" | None, for decoded pixels
    token_dtype: str = "uint16"  # token shards: the dtype of their ids (the tokenizer's, fastload.formats.index.token_dtype)


def open_writer(layout: str, path: Path, options: WriterOptions) -> ShardWriter:
    """A writer for one shard at its final ``path``."""
    module = importlib.import_module(shard_format(layout).writer)
    return module.open_writer(path, options)


def write_beside(path: Path, data: bytes) -> Path:
    """``data`` written to a new temporary file beside ``path`` (:func:`fastload._util.files.temporary_beside`:
    a fresh unguessable name, so a retried Ray task never writes into another's file and a planted
    link is never written through); its path, for :func:`publish`."""
    fd, tmp = temporary_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def publish(tmp: Path, final: Path) -> None:
    """fsync a finished temporary file and rename it to its final name."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
