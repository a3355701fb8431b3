"""Token shards (fastload.formats.tokens.reader): documents' ids appended to the ``.bin`` as they come,
their boundaries kept, the ``.docs`` table written and both published on ``finish``."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO

import numpy as np

from fastload._util.files import temporary_beside
from fastload.formats.index import TOKEN_DTYPES
from fastload.formats.shard_info import ShardInfo
from fastload.formats.tokens.reader import DOCS_SUFFIX, encode_documents
from fastload.formats.writing import WriterOptions, publish, write_beside


class TokenShardWriter:
    """One token shard: ``add_documents`` appends a batch of documents, ``finish`` publishes it."""

    def __init__(self, path: Path, options: WriterOptions) -> None:
        self.path, self.docs_path = path, path.with_suffix(DOCS_SUFFIX)
        self.dtype = np.dtype(options.token_dtype).newbyteorder("<")
        self.limit = TOKEN_DTYPES[options.token_dtype]
        fd, self._tmp = temporary_beside(path)
        self._file: BinaryIO = os.fdopen(fd, "wb", buffering=1 << 20)  # open across add_documents(), closed by finish()/abort()
        self._sha = hashlib.sha256()
        self._lengths: list[np.ndarray] = []
        self.tokens = 0

    def add_documents(self, ids: np.ndarray, lengths: np.ndarray) -> None:
        """Append documents: their ids back to back (each below the dtype's limit) and each one's count."""
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.limit):
            raise ValueError(f"{self.path.name}: a token id outside {self.dtype.name}'s range")
        data = np.ascontiguousarray(ids.astype(self.dtype, copy=False)).data.cast("B")  # written and hashed in place, no bytes copy
        self._file.write(data)
        self._sha.update(data)
        self._lengths.append(np.asarray(lengths, dtype=np.int64))
        self.tokens += len(ids)

    def finish(self) -> ShardInfo:
        """Publish the document table, then the tokens; return the shard's index entry."""
        self._file.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        table = encode_documents(offsets, self.dtype.itemsize)
        publish(write_beside(self.docs_path, table), self.docs_path)
        publish(self._tmp, self.path)
        return ShardInfo(path=self.path.name, samples=len(lengths), bytes=self.tokens * self.dtype.itemsize, sha256=self._sha.hexdigest(),
                         table=self.docs_path.name, table_sha256=hashlib.sha256(table).hexdigest(), tokens=self.tokens)

    def abort(self) -> None:
        """Close and delete the temporary file."""
        self._file.close()
        self._tmp.unlink(missing_ok=True)


def open_writer(path: Path, options: WriterOptions) -> TokenShardWriter:
    """A token shard writer, its ids in ``options.token_dtype``."""
    return TokenShardWriter(path, options)
