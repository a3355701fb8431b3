"""A Lance dataset read in place: the one module importing ``lance`` (pylance). A fragment's rows
are cut into slices of at most SLICE_ROWS, each a shard (a fragment holds up to a million rows by
default: as one shard it would be one window of the streaming order); a slice is read through
the fragment's scanner (its offset and limit) in batches of BATCH_ROWS, kept in the process's
cache of decoded batches (:mod:`fastload.formats.in_place_reader`). The index records the dataset's
version: a dataset written to since has another, and its index is made again.

pylance is not fork-safe (its maintainers' word: a process forked after it ran may hang in it),
and fastload's workers are forked. So pylance never runs in a process of fastload's: each process
that reads a Lance dataset (the training process, each worker) has a fresh interpreter of its own
(:func:`lance_process`) that runs every pylance call and sends the batches it reads back as an
Arrow IPC stream, whatever the process or the user's own code did with pylance before.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastload._util.processes import FreshInterpreter
from fastload.errors import SampleError, ShardError
from fastload.formats.in_place_reader import InPlaceReader, _cache
from fastload.formats.parquet.bounds import import_pyarrow

if TYPE_CHECKING:
    from fastload.formats.shard_info import ShardInfo

SLICE_ROWS = 512  # a shard: at most this many rows of one fragment
BATCH_ROWS = 64  # rows a read decodes at once (images: a few MB)
U64_MAX = (1 << 64) - 1  # Lance's second manifest naming counts versions down from it

_processes: dict[int, FreshInterpreter] = {}  # each process's own, by its pid (a forked child's parent's is not its)
_starting = threading.Lock()


def _forked() -> None:
    global _starting
    _starting = threading.Lock()  # another thread of the parent may have held it


def _close_own() -> None:
    own = _processes.pop(os.getpid(), None)
    if own is not None:  # at exit: it would go within PARENT_POLL_S anyway, without being waited for
        own.close()


os.register_at_fork(after_in_child=_forked)
atexit.register(_close_own)


def lance_process() -> FreshInterpreter:
    """This process's interpreter running pylance, started on first use; it exits with this process."""
    pid = os.getpid()
    with _starting:
        if pid not in _processes:
            _processes[pid] = FreshInterpreter()
        return _processes[pid]


def import_lance() -> Any:
    """lance, or an error naming the package that installs it."""
    try:
        import lance
    except ImportError:
        raise ImportError("reading a Lance dataset needs pylance: pip install pylance") from None
    return lance


def open_dataset(uri: str, version: int | None = None) -> Any:
    """In the Lance process: the Lance dataset at ``uri`` (at ``version``), kept for OPEN_FILES
    datasets; a ValueError naming it where it cannot be opened."""
    def opened() -> Any:
        try:
            return import_lance().dataset(uri, version=version)
        except (OSError, ValueError, RuntimeError) as exc:
            raise ValueError(f"{uri}: not a readable Lance dataset ({' '.join(str(exc).split())[:160]})") from None

    return _cache.file(("lance", uri, version), opened)


def version_digest(version: int) -> str:
    """What the index records as a Lance dataset's checksum: the sha256 naming its version."""
    return hashlib.sha256(f"lance version {version}".encode()).hexdigest()


def dataset_version(uri: str) -> int:
    """In the Lance process: the dataset's latest version."""
    return int(import_lance().dataset(uri).version)


def listed_version(uri: str) -> int | None:
    """The latest version of the local dataset at ``uri`` from the names of its manifests alone
    (``_versions/N.manifest``, or in Lance's second naming scheme ``_versions/M.manifest`` with M
    = 2**64 - 1 - N in 20 digits), without pylance: None where a manifest's name is neither, or
    there is none."""
    try:
        names = os.listdir(os.path.join(uri, "_versions"))
    except OSError:
        return None
    versions = []
    for name in names:
        stem, _, extension = name.partition(".")
        if extension != "manifest":
            continue
        if not stem.isdigit():
            return None
        number = int(stem)
        versions.append(U64_MAX - number if len(stem) == 20 and number > U64_MAX // 2 else number)
    return max(versions) if versions else None


def lance_parts(uri: str, name: str) -> tuple[list[ShardInfo], Any, int]:
    """In the Lance process: (the index's entries of the dataset at ``uri``, named ``name``: slices
    of SLICE_ROWS rows of each fragment; its schema; its version)."""
    from fastload.formats.shard_info import ShardInfo

    dataset = open_dataset(uri, dataset_version(uri))  # the latest version, pinned (a reader reads the one indexed)
    digest, shards = version_digest(int(dataset.version)), []
    for fragment in dataset.get_fragments():
        rows = int(fragment.count_rows())
        for start in range(0, rows, SLICE_ROWS):
            shards.append(ShardInfo(name, min(SLICE_ROWS, rows - start), 0, digest, row_group=int(fragment.fragment_id),
                                    first_row=start, span_start=0, file_bytes=0, footer_bytes=0, version=int(dataset.version)))
    return shards, dataset.schema, int(dataset.version)


def scanned_batches(uri: str, shard: ShardInfo, columns: Mapping[str, str], version: int | None, read: tuple[str, ...],
                    number: int) -> tuple[int, Any]:
    """In the Lance process: the slice ``shard``'s batches of its ``read`` columns read on the way to
    batch ``number`` (its scanner goes on from the last call's, or starts again behind it) as
    (the first one's number, an Arrow IPC stream of them); a ValueError saying why where its data
    is damaged."""
    slice_ = _Slice(uri, shard, columns, version)
    fragment = open_dataset(uri, version).get_fragment(slice_.part)
    if fragment is None:
        raise ShardError(f"{slice_.shown}: no fragment {slice_.part} (the dataset changed since it was indexed?)")

    def batches() -> Any:
        return fragment.to_batches(columns=list(read), offset=shard.first_row or 0, limit=slice_.rows, batch_size=BATCH_ROWS,
                                   strict_batch_size=True)

    pa = import_pyarrow()
    try:
        slice_._cached(read, number, batches, -(-slice_.rows // BATCH_ROWS))  # keeps each batch it reads
        group = (*slice_._id, read)
        passed = sorted((key[-1], _cache.drop(key)) for key in [key for key in _cache.batches if key[:-1] == group])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, passed[0][1].schema) as stream:
            for _, batch in passed:
                stream.write_batch(batch)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ValueError(f"damaged Lance data in fragment {slice_.part} ({' '.join(str(exc).split())[:160]})") from None
    return passed[0][0], sink.getvalue()


class _Slice(InPlaceReader):
    """A slice of a fragment as the Lance process and the reader both name it."""

    def __init__(self, uri: str | Path, shard: ShardInfo, columns: Mapping[str, str], version: int | None) -> None:
        super().__init__(shard, columns, uri)
        self.uri, self.version = str(uri), version
        self._id = (*self._id, shard.first_row)  # a fragment's slices are shards of their own

    def key(self, i: int) -> str:
        """``photos.lance:fragment3:row12``: the dataset, the fragment and its row."""
        return f"{self.shown}:fragment{self.part}:row{(self.shard.first_row or 0) + i}"


class LanceSliceReader(_Slice):
    """Rows ``first_row`` on of fragment ``row_group`` of the Lance dataset at ``uri`` (of the
    index's version) as a shard; ``columns`` maps each column read to its role. Its batches come
    from this process's Lance process (:func:`lance_process`)."""

    def open(self) -> None:
        """Start this process's Lance process now (its first batch opens the dataset there)."""
        lance_process()

    def _batch_of(self, i: int, columns: tuple[str, ...]) -> tuple[Any, int]:
        number, row = divmod(i, BATCH_ROWS)
        batch = _cache.hit((*self._id, columns, number))
        if batch is not None:
            return batch, row
        try:
            first, stream = lance_process().call(scanned_batches, self.uri, self.shard, self.columns, self.version, columns, number)
        except ValueError as exc:
            raise SampleError(self.where(i), str(exc)) from None
        for n, got in enumerate(import_pyarrow().ipc.open_stream(stream), first):
            _cache.keep((*self._id, columns, n), got)  # those read on the way are kept too, as a scanner of this process's would
            if n == number:
                batch = got
        return batch, row
