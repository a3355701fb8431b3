"""``fastload index DIR``: make a folder of existing WebDataset tars (img2dataset's, any WebDataset
writer's) a fastload dataset in place: a DALI ``.idx`` beside each tar and ``index.json`` last,
the tars left untouched.

Each tar is read once: it is mapped, and two tasks read the mapping, its sha256 (hashlib
releases the GIL for the whole file) and its members' data offsets (one header per member: the
parser jumps from header to header by the size field, as tar does, never touching the data).
Those tasks run in a thread pool, every tar's at once, so hashing, parsing and the disk overlap;
the .idx files are fsynced there too, the folder once. (Over 31 MB of 30 KB members, tarfile's
stream mode took 114-135 ms, the first one-pass version 50-74 ms, sha256 alone 20-50 ms:
``benchmarks/bench_index.py`` measures this against ``cat`` and sha256 alone.) Members are
grouped into samples as webdataset does: by key, the name up to the first dot of its last path
part, consecutive members sharing one; files without an extension, hidden files and ``__*__``
metadata members are left out.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from fastload.errors import DatasetIndexError, SampleError
from fastload.fields import IMAGE_FIELDS, LABEL_FIELD, is_field_member, parse_label
from fastload.files import atomic_write_bytes, check_relative_path, fsync_dir, open_regular
from fastload.formats.idx import Member, format_dali_index, split_member_name
from fastload.formats.table import MAX_LABEL_BYTES, TABLE_SUFFIX, tar_table
from fastload.index import INDEX_FILE, DatasetIndex, ShardInfo, write_index

SOURCE_NAME = "wds-index"  # the index's ``source``: tars indexed in place, not converted


BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
_WHITESPACE = re.compile(r"\s")  # what str.isspace calls whitespace: the .idx format splits on it
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


def _members(view: memoryview, path: str) -> Iterator[tuple[int, str, int, int]]:
    """Yield (member number, name, data offset, size) of every regular file, parsing the headers
    (ustar, pax ``x`` records, GNU long names) in order; ValueError for a header that is not one."""
    pos, number, pending = 0, 0, {}  # type: int, int, dict[str, str]
    end, where = len(view), str(path)
    while pos + BLOCK <= end:
        header = view[pos : pos + BLOCK].tobytes()
        if header == ZERO_BLOCK:
            return  # end of archive
        stored = header[148:156]
        if _number(stored, where) != sum(header) - sum(stored) + 8 * 32:
            raise ValueError(f"{path}: not a readable tar (bad header checksum at byte {pos})")
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
        elif kind == b"L":
            pending["path"] = bytes(view[data : data + size]).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif kind != b"g" and kind != b"K":
            name = header[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if header[257:262] == b"ustar" and header[345:346] != b"\0":
                name = header[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape") + "/" + name
            if pending:
                name = pending.get("path", name)
                pending = {}
            if kind in _REGULAR:
                yield number, name, data, size
            number += 1
        pos = data + -(-size // BLOCK) * BLOCK


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


def tar_sha256(path: Path) -> tuple[int, str]:
    """(size, sha256) of a tar, hashed in one call (hashlib releases the GIL while it hashes)."""
    return _mapped(path, lambda view: (len(view), hashlib.sha256(view).hexdigest()))


def tar_members(path: Path, shown: str | None = None) -> IndexedTar:
    """A tar's samples' members (ext, data offset, size, name), fields and labels, from its
    headers alone. A ValueError names the tar (as ``shown``, else its path; and the member by
    number) when it cannot be indexed."""

    def read(view: memoryview) -> IndexedTar:
        out, keys = IndexedTar(), []  # type: IndexedTar, list[str]
        name_shown = shown or str(path)
        for number, name, offset, length in _members(view, name_shown):
            _add_member(out, keys, view, number, name, offset, length, name_shown)
        return out

    return _mapped(path, read)


def _add_member(out: IndexedTar, keys: list[str], view: memoryview, number: int, name: str, offset: int, size: int, path: str) -> None:
    if not is_field_member(name):
        return  # no extension, hidden, or webdataset's metadata members
    key, ext = split_member_name(name)
    if _WHITESPACE.search(name):
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


def index_tars(root: str | Path, force: bool = False) -> tuple[DatasetIndex, float]:
    """Write a ``.idx`` and a sample table beside every ``*.tar`` in ``root`` and then ``root/index.json``; refuses to
    replace an existing index.json unless ``force``. Returns the index and the seconds it took."""
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
    shards, scans = [], []  # type: list[ShardInfo], list[IndexedTar]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        hashed: list[Future[tuple[int, str]]] = []
        parsed: list[Future[IndexedTar]] = []
        for tar in tars:  # a tar's two tasks side by side: a cold file is read from disk once
            hashed.append(pool.submit(tar_sha256, tar))
            parsed.append(pool.submit(tar_members, tar))
        written = []
        for tar, members, digest in zip(tars, parsed, hashed, strict=True):
            scanned = members.result()
            info, files = indexed_shard(tar, scanned, *digest.result())
            written += [pool.submit(_write_file, path, data) for path, data in files.items()]
            shards.append(info)
            scans.append(scanned)
        for done in written:
            done.result()
    fsync_dir(root)  # the .idx renames, once for all, before index.json names them
    index = dataset_index(shards, scans)
    write_index(root, index)
    return index, time.perf_counter() - start


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
    atomic_write_bytes(path, data, durable=False)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
