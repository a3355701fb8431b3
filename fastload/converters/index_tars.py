"""``fastload index DIR``: make a folder of existing WebDataset tars (img2dataset's, any WebDataset
writer's) a fastload dataset in place: a DALI ``.idx`` beside each tar and ``index.json`` last,
the tars left untouched.

Each tar is read once, front to back: its sha256 and its members' data offsets come from the same
pass. Members are grouped into samples as webdataset does: by key, the name up to the first dot
of its last path part, consecutive members sharing one; files without an extension, hidden files
and ``__*__`` metadata members are left out.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from fastload.errors import DatasetIndexError
from fastload.fields import IMAGE_FIELDS, LABEL_FIELD, parse_label
from fastload.index import (
    INDEX_FILE,
    DatasetIndex,
    Member,
    ShardInfo,
    atomic_write_bytes,
    check_relative_path,
    format_dali_index,
    open_regular,
    split_member_name,
    write_index,
)

SOURCE_NAME = "wds-index"  # the index's ``source``: tars indexed in place, not converted
READ_BLOCK = 1 << 20
MAX_LABEL_BYTES = 32  # a cls member is read (to count classes) only when it is this small


class _HashingReader(io.RawIOBase):
    """A file read front to back, hashed as it is read (tarfile's stream mode reads every byte)."""

    def __init__(self, raw: io.BufferedReader) -> None:
        self._raw = raw
        self.sha = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = self._raw.readinto(buffer)
        self.sha.update(memoryview(buffer)[:n])
        self.size += n
        return n


@dataclass
class IndexedTar:
    """One tar's members grouped into samples, its size, sha256 and the labels found."""

    samples: list[list[Member]] = field(default_factory=list)
    fields: set[str] = field(default_factory=set)
    labels: Counter[int] = field(default_factory=Counter)
    size: int = 0
    sha256: str = ""


def scan_tar_once(path: Path) -> IndexedTar:
    """Read ``path`` once: its samples' members (ext, data offset, size, name), its sha256.
    A ValueError names the tar (and the member by number) when it cannot be indexed."""
    out = IndexedTar()
    keys: list[str] = []
    try:
        with open(open_regular(path), "rb", buffering=0, closefd=True) as raw:
            reader = _HashingReader(raw)  # type: ignore[arg-type]
            with tarfile.open(fileobj=io.BufferedReader(reader, READ_BLOCK), mode="r|") as tar:
                for number, member in enumerate(tar):
                    _add_member(out, keys, tar, member, number, path)
            while reader.read(READ_BLOCK):  # the end-of-archive blocks and padding count too
                pass
    except (tarfile.TarError, EOFError) as exc:
        raise ValueError(f"{path}: not a readable tar ({type(exc).__name__}: {exc})") from None
    except OSError as exc:
        raise OSError(exc.errno, f"cannot read it ({exc.strerror})", str(path)) from None
    out.size, out.sha256 = reader.size, reader.sha.hexdigest()
    return out


def _add_member(out: IndexedTar, keys: list[str], tar: tarfile.TarFile, member: tarfile.TarInfo, number: int, path: Path) -> None:
    if not member.isfile():
        return
    name = member.name
    key, ext = split_member_name(name)
    base = name.rsplit("/", 1)[-1]
    if not ext or not key or key.endswith("/") or base.startswith(".") or (base.startswith("__") and key.endswith("__")):
        return  # no extension, hidden, or webdataset's metadata members
    if any(c.isspace() for c in name):
        raise ValueError(f"{path}: member {number}'s name holds whitespace, which the .idx format cannot hold")
    if not keys or keys[-1] != key:
        keys.append(key)
        out.samples.append([])
    members = out.samples[-1]
    if any(existing == ext for existing, *_ in members):
        raise ValueError(f"{path}: member {number} repeats field {ext} of the sample before it (one key, two .{ext} members)")
    members.append((ext, member.offset_data, member.size, name))
    out.fields.add(ext)
    if ext == LABEL_FIELD and member.size <= MAX_LABEL_BYTES:
        try:
            out.labels[parse_label(tar.extractfile(member).read(), f"{path}:{key}")] += 1  # type: ignore[union-attr]
        except ValueError:
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
