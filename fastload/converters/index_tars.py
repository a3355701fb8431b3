"""``fastload index DIR``: make a folder of existing WebDataset tars (img2dataset's, any WebDataset
writer's) a fastload dataset in place: a DALI ``.idx`` and a sample table beside each tar and
``index.json`` last, the tars left untouched.

Each tar is read once: it is mapped, one thread hashes the whole mapping (hashlib releases the
GIL while it hashes) while the other parses its members' headers (one per member: the parser
jumps from header to header by the size field, as tar does, never touching the data), so hashing
and parsing overlap and the disk is read once. The tars are indexed in parallel by ``workers``
processes (default: one per CPU; each writes its tar's .idx and table, fsynced; the folder is
fsynced once). ``benchmarks/bench_index.py`` measures this against ``cat`` and sha256 alone.
Members are grouped into samples as webdataset does: by key, the name up to the first dot of its
last path part, consecutive members sharing one; files without an extension, hidden files and
``__*__`` metadata members are left out.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

from fastload.errors import DatasetIndexError, SampleError
from fastload.fields import IMAGE_FIELDS, LABEL_FIELD, is_field_member, parse_label
from fastload.files import atomic_write_bytes, check_relative_path, fsync_dir, open_regular
from fastload.formats.idx import IDX_WHITESPACE, Member, format_dali_index, split_member_name
from fastload.formats.index import INDEX_FILE, DatasetIndex, ShardInfo, write_index
from fastload.formats.table import MAX_LABEL_BYTES, TABLE_SUFFIX, tar_table
from fastload.processes import forked_pool

SOURCE_NAME = "wds-index"  # the index's ``source``: tars indexed in place, not converted


BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7")  # regular file, old-style regular file, contiguous file


@dataclass
class IndexedTar:
    """One tar's members grouped into samples, the fields and the labels found."""

    samples: list[list[Member]] = field(default_factory=list)
    fields: set[str] = field(default_factory=set)
    labels: Counter[int] = field(default_factory=Counter)


def _number(raw: bytes, where: str) -> int:
    """A tar header's numeric field: octal digits, or GNU's base-256 (high bit set)."""
    if raw[:1] and raw[0] & 0x80:
        return int.from_bytes(raw[1:], "big")
    digits = raw.split(b"\0", 1)[0].strip()
    try:
        return int(digits, 8) if digits else 0
    except ValueError:
        raise ValueError(f"{where}: a tar header holds a malformed number") from None


def _pax_records(data: bytes) -> dict[str, str]:
    """A pax extended header's records ("LEN key=value\n" each)."""
    records, pos = {}, 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def _members(view: memoryview, path: str) -> list[tuple[int, str, int, int]]:
    """(member number, name, data offset, size) of every regular file, parsing the headers (ustar,
    pax ``x`` records, GNU long names) in order; ValueError for a header that is not one. The
    headers' checksums are checked all at once (numpy: a Python sum of 512 bytes was a quarter of the
    parse), the first bad one named whatever else its damage broke first."""
    members: list[tuple[int, str, int, int]] = []
    positions: list[int] = []
    stored: list[int] = []  # each header's recorded checksum
    try:
        _parse_headers(view, path, members, positions, stored)
    except ValueError:
        _check_sums(view, positions, stored, path)  # a damaged header before or at the failure is the error
        raise
    _check_sums(view, positions, stored, path)
    return members


def _parse_headers(view: memoryview, path: str, members: list, positions: list[int], stored: list[int]) -> None:
    pos, number, pending = 0, 0, {}  # type: int, int, dict[str, str]
    regular: dict[str, tuple[int, int]] = {}  # (data offset, size) of each regular file so far, by name: what hard links name
    end, where = len(view), str(path)
    while pos + BLOCK <= end:
        header = view[pos : pos + BLOCK].tobytes()
        if header == ZERO_BLOCK:
            return  # end of archive
        stored.append(_number(header[148:156], where))
        positions.append(pos)
        size = _number(header[124:136], where)
        kind = header[156:157]
        data = pos + BLOCK
        if pending and kind not in (b"x", b"L", b"g", b"K"):
            size = int(pending.get("size", size))
        if data + size > end:
            raise ValueError(f"{path}: not a readable tar (member {number} runs past the end of the file)")
        if kind == b"x":
            try:
                pending.update(_pax_records(bytes(view[data : data + size])))
            except ValueError:
                raise ValueError(f"{path}: not a readable tar (a malformed pax header at byte {pos})") from None
        elif kind in (b"L", b"K"):  # GNU long name, long link target
            pending["path" if kind == b"L" else "linkpath"] = bytes(view[data : data + size]).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif kind != b"g":
            name = header[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if header[257:262] == b"ustar" and header[345:346] != b"\0":
                name = header[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape") + "/" + name
            link = header[157:257].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if pending:
                name, link = pending.get("path", name), pending.get("linkpath", link)
                pending = {}
            if kind in _REGULAR:
                members.append((number, name, data, size))
                regular[name] = (data, size)
            elif kind == b"1":  # a hard link (GNU tar stores a file's second link so): the data of the earlier member it names
                if link not in regular:
                    raise ValueError(f"{path}: not a readable tar (member {number} links to {link!r}, not an earlier file)")
                members.append((number, name, *regular[link]))
            number += 1
        pos = data + -(-size // BLOCK) * BLOCK
    raise ValueError(f"{path}: not a readable tar (no end-of-archive block after member {number}: cut short?)")


CHECKED_AT_ONCE = 1 << 15  # headers summed per numpy call (16 MB of them)


def _check_sums(view: memoryview, positions: list[int], stored: list[int], path: str) -> None:
    """A ValueError naming the first header at ``positions`` whose bytes do not sum to its ``stored``
    checksum (the checksum field counted as spaces, as tar does)."""
    for first in range(0, len(positions), CHECKED_AT_ONCE):
        at = np.asarray(positions[first : first + CHECKED_AT_ONCE], np.int64)
        headers = np.frombuffer(view, np.uint8)[at[:, None] + np.arange(BLOCK)]
        sums = headers.sum(axis=1, dtype=np.int64) - headers[:, 148:156].sum(axis=1, dtype=np.int64) + 8 * 32
        bad = np.flatnonzero(sums != np.asarray(stored[first : first + CHECKED_AT_ONCE], np.int64))
        if len(bad):
            raise ValueError(f"{path}: not a readable tar (bad header checksum at byte {positions[first + int(bad[0])]})")


Read = TypeVar("Read")


def _mapped(path: Path, read: Callable[[memoryview], Read]) -> Read:
    """``read`` of ``path``'s bytes, memory-mapped; an OSError naming the file if it cannot be read."""
    try:
        with open(open_regular(path), "rb", closefd=True) as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise ValueError(f"{path}: not a readable tar (empty file)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
                return read(view)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot read it ({exc.strerror})", str(path)) from None


def scan_tar(path: Path, shown: str | None = None) -> tuple[int, str, IndexedTar]:
    """(size, sha256, members) of a tar, its bytes read once: a thread hashes the mapping while this
    one parses the headers. A ValueError names the tar (as ``shown``, else its path; and the member
    by number) when it cannot be indexed."""
    name_shown = shown or str(path)

    def read(view: memoryview) -> tuple[int, str, IndexedTar]:
        with ThreadPoolExecutor(max_workers=1) as hasher:  # its exit waits for the hash: the view outlives it
            digest = hasher.submit(lambda: hashlib.sha256(view).hexdigest())
            out, keys = IndexedTar(), []  # type: IndexedTar, list[str]
            for number, name, offset, length in _members(view, name_shown):
                _add_member(out, keys, view, number, name, offset, length, name_shown)
            return len(view), digest.result(), out

    return _mapped(path, read)


def _add_member(out: IndexedTar, keys: list[str], view: memoryview, number: int, name: str, offset: int, size: int, path: str) -> None:
    if not is_field_member(name):
        return  # no extension, hidden, or webdataset's metadata members
    key, ext = split_member_name(name)
    if IDX_WHITESPACE.search(name):
        raise ValueError(f"{path}: member {number}'s name holds whitespace, which the .idx format cannot hold")
    try:
        name.encode()
    except UnicodeEncodeError:
        raise ValueError(f"{path}: member {number}'s name is not UTF-8") from None
    if not keys or keys[-1] != key:
        keys.append(key)
        out.samples.append([])
    members = out.samples[-1]
    for existing, *_ in members:
        if existing == ext:
            raise ValueError(f"{path}: member {number} repeats field {ext} of the sample before it (one key, two .{ext} members)")
    members.append((ext, offset, size, name))
    out.fields.add(ext)
    if ext == LABEL_FIELD and size <= MAX_LABEL_BYTES:
        with contextlib.suppress(SampleError):  # not an integer: the loader reports that sample when it reads it
            out.labels[parse_label(bytes(view[offset : offset + size]), f"{path}:{key}")] += 1


def index_tars(root: str | Path, force: bool = False, workers: int | None = None) -> tuple[DatasetIndex, float]:
    """Write a ``.idx`` and a sample table beside every ``*.tar`` in ``root`` and then ``root/index.json``, the tars
    indexed by ``workers`` processes (default: one per CPU; 1: in this process); refuses to replace an existing
    index.json unless ``force``. Returns the index and the seconds it took."""
    start = time.perf_counter()
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such folder")
    if (root / INDEX_FILE).exists() and not force:
        raise FileExistsError(f"{root / INDEX_FILE} exists: pass --force to replace it")
    tars = sorted(path for path in root.glob("*.tar") if path.is_file())
    if not tars:
        raise FileNotFoundError(f"{root}: no .tar files to index")
    for tar in tars:
        check_tar_name(tar.name, str(tar))
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    workers = min(workers or os.cpu_count() or 1, len(tars))
    if workers == 1:
        done = [index_tar(tar) for tar in tars]
    else:
        with forked_pool(workers) as pool:
            futures = [pool.submit(index_tar, tar) for tar in tars]
            try:
                done = [future.result() for future in futures]  # the first bad tar in name order is the one named
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    fsync_dir(root)  # the .idx renames, once for all, before index.json names them
    index = dataset_index([info for info, _ in done], [scanned for _, scanned in done])
    write_index(root, index)
    return index, time.perf_counter() - start


def index_tar(tar: Path) -> tuple[ShardInfo, IndexedTar]:
    """Index one tar: its .idx and sample table written beside it (fsynced), its index entry, and
    its fields and labels (the samples' members left out: they stay in the files)."""
    size, sha256, scanned = scan_tar(tar)
    info, files = indexed_shard(tar, scanned, size, sha256)
    for path, data in files.items():
        _write_file(path, data)
    return info, IndexedTar(fields=scanned.fields, labels=scanned.labels)


def check_tar_name(name: str, where: str) -> None:
    """A ValueError naming the tar unless its name can be an index's shard path."""
    try:
        check_relative_path(name, "shard")
    except DatasetIndexError:
        raise ValueError(f"{where}: its name must be letters, digits and ._+=,@- only (rename it to index it)") from None


def indexed_shard(tar: Path, scanned: IndexedTar, size: int, sha256: str) -> tuple[ShardInfo, dict[Path, bytes]]:
    """A tar's index entry (``size`` and ``sha256`` its own) and the files that index it, by the
    path beside it each goes to: its ``.idx`` and its sample table."""
    idx, table = tar.with_suffix(".idx"), tar.with_suffix(TABLE_SUFFIX)
    files = {idx: format_dali_index(scanned.samples), table: tar_table(tar, scanned.samples)}
    info = ShardInfo(tar.name, len(scanned.samples), size, sha256, idx.name, hashlib.sha256(files[idx]).hexdigest(),
                     table.name, hashlib.sha256(files[table]).hexdigest())
    return info, files


def dataset_index(shards: list[ShardInfo], scans: list[IndexedTar]) -> DatasetIndex:
    """The index of tars indexed in place: their shards, and the fields and labels found in them."""
    fields: set[str] = set()
    labels: Counter[int] = Counter()
    for scanned in scans:
        fields |= scanned.fields
        labels.update(scanned.labels)
    return DatasetIndex(
        layout="wds",
        shards=tuple(shards),
        fields=tuple(sorted(fields)),
        class_counts={str(label): count for label, count in sorted(labels.items())},
        image_fields=tuple(sorted(f for f in fields if f in IMAGE_FIELDS)),
        source=SOURCE_NAME,
    )


def _write_file(path: Path, data: bytes) -> None:
    """``path`` replaced atomically by ``data``, fsynced (the folder is fsynced once by the caller)."""
    atomic_write_bytes(path, data, sync_folder=False)
