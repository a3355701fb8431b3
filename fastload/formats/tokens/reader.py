"""Token shards (layout ``tokens``): a shard is two files, written by
:mod:`fastload.formats.tokens.writer` and read here.

``shard-00000.bin`` holds the token ids of its documents back to back, little-endian, in the
dataset's dtype (``uint16`` up to 65,536 ids, else ``uint32``), nothing else: nanoGPT's and
Megatron's ``.bin``, so ``numpy.memmap`` reads it as it is. ``shard-00000.docs`` holds where each
document starts:

======================  =====================================================================
bytes 0-7               magic ``b"FLTOKDOC"``
8-15, 16-23             N documents (uint64), T tokens (uint64)
24-31                   bytes per token id (uint64: 2 or 4)
32-63                   zero
offsets                 N + 1 uint64: document i is tokens ``offsets[i]:offsets[i + 1]``;
                        ``offsets[0]`` is 0, ``offsets[N]`` is T
======================  =====================================================================

Chosen by measurement (docs/tokens.md): a span of any document, or of several consecutive ones,
is one ``pread`` of the ``.bin`` at ``start * itemsize``, and the table is memory-mapped, so a
process holds nothing per document and the page cache one copy for every worker. Every length
read from either file is checked against the index and the file sizes before it is used.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fastload._util.files import close_when_dropped, open_in_root, this_process
from fastload.errors import ShardError
from fastload.formats.token_counts import ShardTokens

if TYPE_CHECKING:
    from fastload.formats.table import Facts

DOCS_MAGIC = b"FLTOKDOC"
DOCS_SUFFIX = ".docs"
_HEADER = struct.Struct("<8sQQQ32x")
TOKENS_FIELD = "tokens"  # the field a token dataset's samples (documents) hold
CHECK_BLOCK = 1 << 24  # tokens checked against the vocabulary at a time by ``check``


def documents_header(documents: int, tokens: int, itemsize: int) -> bytes:
    """The header of a document table of ``documents`` documents holding ``tokens`` ids of ``itemsize`` bytes."""
    return _HEADER.pack(DOCS_MAGIC, documents, tokens, itemsize)


def encode_documents(offsets: np.ndarray, itemsize: int) -> bytes:
    """The document table of a shard whose document i spans tokens ``offsets[i]:offsets[i + 1]``."""
    offsets = np.asarray(offsets, dtype="<u8")
    return documents_header(len(offsets) - 1, int(offsets[-1]), itemsize) + offsets.tobytes()


class TokenShardReader:
    """One token shard read by ``pread`` (tokens) and ``mmap`` (its document table ``docs``),
    opened lazily in each process; every length checked against the index's ``samples`` and
    ``counts`` before use."""

    def __init__(self, data: str | Path, docs: str | Path, samples: int, counts: ShardTokens, root: str | None = None) -> None:
        self.data, self.docs, self.samples, self.root = data, docs, samples, root
        self.dtype = np.dtype(counts.dtype).newbyteorder("<")
        self.vocab_size = counts.vocab_size
        self.checks_ids = counts.vocab_size < 2 ** (8 * self.dtype.itemsize)  # ids the dtype holds may lie past the vocabulary
        self.tokens = counts.tokens
        self._fd: int | None = None
        self._pid = -1
        self._map: mmap.mmap | None = None
        self._offsets: np.ndarray | None = None

    def __len__(self) -> int:
        return self.samples

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fd"], state["_pid"], state["_map"], state["_offsets"], state["_closer"] = None, -1, None, None, None
        return state

    def _fail(self, what: str) -> ShardError:
        return ShardError(f"{self.data}: {what}")

    def open(self) -> None:
        """Open the token file and map the document table in this process (checked against the index)."""
        if self._fd is not None and self._pid == this_process():
            return
        self._fd = self._map = self._offsets = None  # inherited across a fork: this process opens its own
        try:
            fd, size, self.data = open_in_root(self.data, self.root)
        except OSError as exc:
            raise self._fail(f"cannot open the token file ({exc.strerror})") from None
        try:
            if size != self.tokens * self.dtype.itemsize:
                raise self._fail(f"holds {size} bytes, the index says {self.tokens} tokens of {self.dtype.itemsize} bytes")
            self._offsets = self._map_documents()
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._pid, self._closer = fd, this_process(), close_when_dropped(self, fd)

    def _map_documents(self) -> np.ndarray:
        """The document table's offsets, memory-mapped, after its header and size are checked."""
        name = Path(self.docs).name
        try:
            fd, size, self.docs = open_in_root(self.docs, self.root)
        except OSError as exc:
            raise self._fail(f"cannot open its document table {name} ({exc.strerror})") from None
        try:
            expected = _HEADER.size + 8 * (self.samples + 1)
            if size != expected:
                raise self._fail(f"its document table {name} holds {size} bytes, {expected} for the index's {self.samples} documents")
            self._map = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        magic, documents, tokens, itemsize = _HEADER.unpack_from(self._map)
        if magic != DOCS_MAGIC:
            raise self._fail(f"{name} is not a fastload document table (bad magic)")
        if (documents, tokens, itemsize) != (self.samples, self.tokens, self.dtype.itemsize):
            raise self._fail(f"{name} describes {documents} documents, {tokens} tokens of {itemsize} bytes; the index "
                             f"{self.samples}, {self.tokens} of {self.dtype.itemsize}")
        offsets = np.frombuffer(self._map, dtype="<u8", offset=_HEADER.size)
        if offsets[0] != 0 or offsets[-1] != self.tokens:
            raise self._fail(f"{name}: its offsets do not run from 0 to the shard's {self.tokens} tokens")
        return offsets

    def offsets(self) -> np.ndarray:
        """Every document's first token, then the shard's token count (uint64, memory-mapped: not
        copied); a caller checks the part it uses with :meth:`checked_offsets`. Called before each
        read of the mapping: a table cut short since it was mapped is a ShardError, not a SIGBUS."""
        self.open()
        assert self._offsets is not None and self._map is not None
        if self._map.size() < len(self._map):  # the file's size now (the mapping keeps a descriptor of it)
            raise self._fail(f"its document table {Path(self.docs).name} is cut short (truncated since it was opened?)")
        return self._offsets

    def descriptor(self) -> int:
        """This process's descriptor of the token file (opened here if need be), for reads into a caller's buffer."""
        self.open()
        assert self._fd is not None
        return self._fd

    def checked_offsets(self, first: int, last: int) -> np.ndarray:
        """Offsets ``first..last`` (inclusive) as int64, refused unless they ascend within the shard."""
        part = self.offsets()[first : last + 1].astype(np.int64)
        if len(part) and (np.any(np.diff(part) < 0) or part[0] < 0 or part[-1] > self.tokens):
            raise self._fail(f"its document table's offsets {first}..{last} do not ascend within its {self.tokens} tokens (tampered?)")
        return part

    def bounds(self, i: int) -> tuple[int, int]:
        """Document ``i``'s first token and the token after its last."""
        if not 0 <= i < len(self):
            raise IndexError(f"{self.data}: document {i} of {len(self)}")
        start, end = self.checked_offsets(i, i + 1).tolist()
        return start, end

    def read_tokens(self, start: int, count: int) -> np.ndarray:
        """Tokens ``start`` to ``start + count`` of the shard, in one ``pread`` (ids checked against the vocabulary)."""
        if not (start >= 0 and count >= 0 and start + count <= self.tokens):
            raise self._fail(f"tokens {start}..{start + count} lie outside its {self.tokens} tokens")
        self.open()
        size = count * self.dtype.itemsize
        data = os.pread(self._fd, size, start * self.dtype.itemsize)  # type: ignore[arg-type]  # open() set it
        if len(data) != size:
            raise self._fail("cut short (truncated since it was opened?)")
        ids = np.frombuffer(data, dtype=self.dtype)
        if self.checks_ids and count and int(ids.max()) >= self.vocab_size:
            raise self._fail(f"token id {int(ids.max())} at or beyond the tokenizer's vocabulary of {self.vocab_size} (tokens {start}..{start + count})")
        return ids

    def document(self, i: int) -> np.ndarray:
        """Document ``i``'s token ids."""
        start, end = self.bounds(i)
        return self.read_tokens(start, end - start)

    def key(self, i: int) -> str:
        """Document ``i``'s key: its number in the shard."""
        if not 0 <= i < len(self):
            raise IndexError(f"{self.data}: document {i} of {len(self)}")
        return str(i)

    def read(self, i: int, fields: Collection[str] | None = None) -> dict[str, bytes]:
        """Document ``i`` as a sample: its ids' little-endian bytes under ``tokens`` (when asked for)."""
        if fields is not None and TOKENS_FIELD not in fields:
            return {}
        return {TOKENS_FIELD: self.document(i).tobytes()}

    def check(self) -> None:
        """The whole shard against its index: the table's offsets ascend, every id is below the
        vocabulary (for ``verify``); a ShardError naming the shard if not."""
        self.checked_offsets(0, len(self))
        for start in range(0, self.tokens, CHECK_BLOCK):
            self.read_tokens(start, min(CHECK_BLOCK, self.tokens - start))

    def stream_facts(self, i: int) -> Facts:
        """Token shards hold no videos: no stream facts."""
        return {}

    def sample_table(self, facts: Sequence[Facts] = ()) -> bytes:
        """Token shards have no sample table: their document table stands in for it."""
        raise ShardError(f"{self.data}: a token shard has no sample table (its document table is {Path(self.docs).name})")

    def close(self) -> None:
        """Close this process's token file (the table's mapping goes with the last reference)."""
        if self._fd is not None and self._pid == this_process():
            self._closer()
        self._fd, self._map, self._offsets = None, None, None
