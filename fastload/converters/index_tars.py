"""``fastload index DIR``: make a folder of existing WebDataset tars (img2dataset's, any WebDataset
writer's) a fastload dataset in place: a DALI ``.idx`` beside each tar and ``index.json`` last,
the tars left untouched.

Each tar is read once, front to back: its sha256 and its members' data offsets come from the same
pass (the headers are parsed here, ustar with pax records and GNU long names: over 31 MB of 30 KB
members written by webdataset's TarWriter, tarfile's stream mode took 114-135 ms, this 50-74 ms,
sha256 alone 20-50 ms). Members are grouped into samples as webdataset does: by key, the name up to the first dot
of its last path part, consecutive members sharing one; files without an extension, hidden files
and ``__*__`` metadata members are left out.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from fastload.errors import DatasetIndexError, SampleError
from fastload.fields import IMAGE_FIELDS, LABEL_FIELD, is_field_member, parse_label
from fastload.files import atomic_write_bytes, check_relative_path, open_regular
from fastload.formats.idx import Member, format_dali_index, split_member_name
from fastload.index import INDEX_FILE, DatasetIndex, ShardInfo, write_index

SOURCE_NAME = "wds-index"  # the index's ``source``: tars indexed in place, not converted
MAX_LABEL_BYTES = 32  # a cls member is read (to count classes) only when it is this small


HASH_BLOCK = 8 << 20  # the file is hashed in blocks, its headers parsed as each block goes by
BLOCK = 512
_REGULAR = (b"0", b"\0", b"7")  # regular file, old-style regular file, contiguous file


@dataclass
class IndexedTar:
    """One tar's members grouped into samples, its size, sha256 and the labels found."""

    samples: list[list[Member]] = field(default_factory=list)
    fields: set[str] = field(default_factory=set)
    labels: Counter[int] = field(default_factory=Counter)
    size: int = 0
    sha256: str = ""


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


def _members(view: memoryview, path: Path):  # type: ignore[no-untyped-def]
    """Yield (member number, name, data offset, size) of every regular file, parsing the headers
    (ustar, pax ``x`` records, GNU long names) in order; ValueError for a header that is not one."""
    pos, number, pending = 0, 0, {}
    end = len(view)
    while pos + BLOCK <= end:
        header = bytes(view[pos : pos + BLOCK])
        if header == bytes(BLOCK):
            return  # end of archive
        if _number(header[148:156], str(path)) != sum(header) - sum(header[148:156]) + 8 * 32:
            raise ValueError(f"{path}: not a readable tar (bad header checksum at byte {pos})")
        size = _number(header[124:136], str(path))
        kind = header[156:157]
        data = pos + BLOCK
        if kind not in (b"x", b"L", b"g", b"K"):
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
            name = pending.get("path", name)
            if kind in _REGULAR:
                yield number, name, data, size
            pending = {}
            number += 1
        pos = data + -(-size // BLOCK) * BLOCK


def scan_tar_once(path: Path) -> IndexedTar:
    """Read ``path`` once: its samples' members (ext, data offset, size, name) and its sha256, the
    headers parsed from each block as it is hashed. A ValueError names the tar (and the member by
    number) when it cannot be indexed."""
    out = IndexedTar()
    keys: list[str] = []
    try:
        with open(open_regular(path), "rb", closefd=True) as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise ValueError(f"{path}: not a readable tar (empty file)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
                sha, hashed = hashlib.sha256(), 0
                for number, name, offset, length in _members(view, path):
                    while hashed < min(offset + length, size):  # hash up to where the parsing got
                        sha.update(view[hashed : hashed + HASH_BLOCK])
                        hashed = min(hashed + HASH_BLOCK, size)
                    _add_member(out, keys, view, number, name, offset, length, path)
                while hashed < size:
                    sha.update(view[hashed : hashed + HASH_BLOCK])
                    hashed = min(hashed + HASH_BLOCK, size)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot read it ({exc.strerror})", str(path)) from None
    out.size, out.sha256 = size, sha.hexdigest()
    return out


def _add_member(out: IndexedTar, keys: list[str], view: memoryview, number: int, name: str, offset: int, size: int, path: Path) -> None:
    if not is_field_member(name):
        return  # no extension, hidden, or webdataset's metadata members
    key, ext = split_member_name(name)
    if any(c.isspace() for c in name):
        raise ValueError(f"{path}: member {number}'s name holds whitespace, which the .idx format cannot hold")
    try:
        name.encode()
    except UnicodeEncodeError:
        raise ValueError(f"{path}: member {number}'s name is not UTF-8") from None
    if not keys or keys[-1] != key:
        keys.append(key)
        out.samples.append([])
    members = out.samples[-1]
    if any(existing == ext for existing, *_ in members):
        raise ValueError(f"{path}: member {number} repeats field {ext} of the sample before it (one key, two .{ext} members)")
    members.append((ext, offset, size, name))
    out.fields.add(ext)
    if ext == LABEL_FIELD and size <= MAX_LABEL_BYTES:
        try:
            out.labels[parse_label(bytes(view[offset : offset + size]), f"{path}:{key}")] += 1
        except SampleError:
            pass  # not an integer: the loader reports that sample when it reads it


def index_tars(root: str | Path, force: bool = False) -> tuple[DatasetIndex, float]:
    """Write a ``.idx`` beside every ``*.tar`` in ``root`` and then ``root/index.json``; refuses to
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
        try:
            check_relative_path(tar.name, "shard")
        except DatasetIndexError:
            raise ValueError(f"{tar}: its name must be letters, digits and ._+=,@- only (rename it to index it)") from None
    shards, fields, labels = [], set(), Counter()
    for tar in tars:
        scanned = scan_tar_once(tar)
        idx = tar.with_suffix(".idx")
        idx_bytes = format_dali_index(scanned.samples)
        atomic_write_bytes(idx, idx_bytes)
        shards.append(ShardInfo(tar.name, len(scanned.samples), scanned.size, scanned.sha256, idx.name, hashlib.sha256(idx_bytes).hexdigest()))
        fields |= scanned.fields
        labels.update(scanned.labels)
    index = DatasetIndex(
        layout="wds",
        shards=tuple(shards),
        fields=tuple(sorted(fields)),
        class_counts={str(label): count for label, count in sorted(labels.items())},
        image_fields=tuple(sorted(f for f in fields if f in IMAGE_FIELDS)),
        source=SOURCE_NAME,
    )
    write_index(root, index)
    return index, time.perf_counter() - start
