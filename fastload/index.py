"""The contract between shard writers and readers: a versioned ``index.json`` at the dataset root.

Writers (``converters``) produce it last, after every shard is complete; readers (the loader,
``inspect``, ``verify``) trust nothing else about a dataset. Per-sample byte offsets of tar shards
live beside each shard in DALI's ``.idx`` format (see :func:`write_dali_index`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Iterable
from typing import Literal

import numpy as np

from fastload.columns import PackedStrings, int_column
from fastload.errors import DatasetIndexError

FORMAT_NAME = "fastload"
FORMAT_VERSION = 2  # 2: HDF5 byte columns stored flat (a group of `bytes` + `offsets`)
READABLE_VERSIONS = (1, 2)
INDEX_FILE = "index.json"
SKIPPED_REPORT = "skipped.jsonl"
DALI_INDEX_VERSION = "v1.2"

Layout = Literal["wds", "hdf5"]
LAYOUTS: tuple[str, ...] = ("wds", "hdf5")
IMAGE_FIELDS: tuple[str, ...] = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm")


def image_field(fields: Iterable[str]) -> str | None:
    """Which of a sample's fields holds its image (the first image extension present), if any."""
    present = set(fields)
    return next((f for f in IMAGE_FIELDS if f in present), None)


@dataclass(frozen=True)
class ShardInfo:
    """One shard file: its path relative to the dataset root, sample count, size and checksum."""

    path: str
    samples: int
    bytes: int
    sha256: str
    offsets: str | None = None  # the DALI .idx beside a tar shard
    offsets_sha256: str | None = None  # its checksum (fetched .idx files are checked too)

    def __post_init__(self) -> None:
        if self.samples < 0 or self.bytes < 0:
            raise DatasetIndexError(f"shard {self.path}: negative samples or bytes")
        if Path(self.path).is_absolute() or ".." in Path(self.path).parts:
            raise DatasetIndexError(f"shard path {self.path!r} must be relative to the dataset root")


@dataclass(frozen=True)
class DatasetIndex:
    """Everything a reader needs to know about a converted dataset."""

    layout: str
    shards: tuple[ShardInfo, ...]
    fields: tuple[str, ...]
    classes: tuple[str, ...] | None = None
    class_counts: dict[str, int] = field(default_factory=dict)
    image_fields: tuple[str, ...] = ()
    decoded_shape: tuple[int, ...] | None = None  # HDF5 holding fixed-size decoded pixels
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    duplicates: int = 0
    source: str = ""  # the source kind it was converted from
    conversion: dict = field(default_factory=dict)  # the options that produced it
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.format != FORMAT_NAME:
            raise DatasetIndexError(f"not a fastload index (format={self.format!r})")
        if self.version not in READABLE_VERSIONS:
            raise DatasetIndexError(
                f"index version {self.version} is not supported (this fastload reads {READABLE_VERSIONS})"
            )
        if self.layout not in LAYOUTS:
            raise DatasetIndexError(f"unknown layout {self.layout!r}; expected one of {LAYOUTS}")

    @property
    def num_samples(self) -> int:
        """Total samples over all shards."""
        return sum(s.samples for s in self.shards)

    @property
    def total_bytes(self) -> int:
        """Total bytes over all shards."""
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> str:
        """Serialise deterministically (sorted keys, no timestamps) so reruns are byte-identical."""
        data = asdict(self)
        data["num_samples"] = self.num_samples
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = INDEX_FILE) -> "DatasetIndex":
        """Parse and validate index.json text; ``where`` names the file in errors."""
        try:
            data = json.loads(text)
            data.pop("num_samples", None)
            data["shards"] = tuple(ShardInfo(**s) for s in data["shards"])
            for name in ("fields", "image_fields"):
                data[name] = tuple(data.get(name) or ())
            for name in ("classes", "decoded_shape"):
                if data.get(name) is not None:
                    data[name] = tuple(data[name])
            return cls(**data)
        except DatasetIndexError as exc:
            raise DatasetIndexError(f"{where}: {exc}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise DatasetIndexError(f"{where}: malformed fastload index ({exc})") from None


def read_index(root: str | os.PathLike[str]) -> DatasetIndex:
    """Read ``ROOT/index.json``; raises :class:`DatasetIndexError` naming the file when it is unusable."""
    path = Path(root) / INDEX_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise DatasetIndexError(
            f"{path}: no index.json — not a converted dataset, or its conversion has not finished"
        ) from None
    return DatasetIndex.from_json(text, where=str(path))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one;
    ``durable`` also fsyncs file and folder (skip it for bookkeeping that may be lost in a crash)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of a whole file, read in 4 MiB blocks."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            sha.update(block)
    return sha.hexdigest()


def write_index(root: str | os.PathLike[str], index: DatasetIndex) -> None:
    """Write ``ROOT/index.json`` atomically; called last, after every shard is in place."""
    atomic_write_bytes(Path(root) / INDEX_FILE, index.to_json().encode())


# --- DALI's webdataset index (.idx), version v1.2 -------------------------------------------
# First line "v1.2 N"; then one line per sample listing, for each of its tar members,
# "ext data_offset size member_name". DALI's fn.readers.webdataset takes these as index_paths.

Member = tuple[str, int, int, str]  # (ext, data offset, size, member name)


def format_dali_index(samples: list[list[Member]]) -> bytes:
    """Render a DALI v1.2 index for a tar shard from each sample's member list."""
    lines = [f"{DALI_INDEX_VERSION} {len(samples)}"]
    for members in samples:
        lines.append(" ".join(f"{ext} {off} {size} {name}" for ext, off, size, name in members))
    return ("\n".join(lines) + "\n").encode()


class TarMembers:
    """A tar shard's parsed ``.idx``, kept compact: every sample's key and each field's
    (data offset, size) in a few flat arrays (~70 bytes a sample where per-sample Python dicts and
    tuples took ~600: 0.8 GB in every worker process for ImageNet's 1.28M samples)."""

    def __init__(self, keys: list[str], first: np.ndarray, exts: list[str], ext_ids: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> None:
        """``ext_ids`` (uint16) index ``exts``; ``first``, ``offsets`` and ``sizes`` are int64."""
        self._keys = PackedStrings(keys)
        self._first = int_column(first)  # sample i's members are first[i]:first[i + 1]
        self._exts, self._ext_ids = exts, int_column(ext_ids, "H")
        self._offsets, self._sizes = int_column(offsets), int_column(sizes)

    def __len__(self) -> int:
        return len(self._first) - 1

    def key(self, i: int) -> str:
        """The key of sample ``i``."""
        return self._keys[i]

    def spans(self, i: int) -> dict[str, tuple[int, int]]:
        """Each field of sample ``i``: {ext: (data offset, size)}."""
        members = slice(self._first[i], self._first[i + 1])
        exts = self._exts
        return {exts[e]: (offset, size) for e, offset, size in zip(self._ext_ids[members], self._offsets[members], self._sizes[members])}


def parse_dali_index(text: str, where: str) -> TarMembers:
    """Parse a DALI v1.2 index (one sample a line, four tokens a member) into :class:`TarMembers`."""
    head, _, body = text.partition("\n")
    if not head.strip():
        raise DatasetIndexError(f"{where}: empty DALI index")
    head_parts = head.split()
    if len(head_parts) != 2 or head_parts[0] != DALI_INDEX_VERSION or not head_parts[1].isdigit():
        raise DatasetIndexError(f"{where}: expected a '{DALI_INDEX_VERSION} N' header, got {head!r}")
    lines = body.splitlines()
    tokens_per_line = np.fromiter(map(len, map(str.split, lines)), np.int64, len(lines))
    malformed = np.flatnonzero((tokens_per_line == 0) | (tokens_per_line % 4 != 0))
    if malformed.size:
        raise DatasetIndexError(f"{where}:{int(malformed[0]) + 2}: malformed sample line")
    if len(lines) != int(head_parts[1]):
        raise DatasetIndexError(f"{where}: header says {head_parts[1]} samples, found {len(lines)}")
    tokens = body.split()
    first = np.zeros(len(lines) + 1, np.int64)
    np.cumsum(tokens_per_line // 4, out=first[1:])
    names = tokens[3::4]
    keys = [split_member_name(names[m])[0] for m in first[:-1].tolist()]
    ext_tokens = tokens[0::4]
    exts = list(dict.fromkeys(ext_tokens))
    ext_ids = np.fromiter(map({ext: e for e, ext in enumerate(exts)}.__getitem__, ext_tokens), np.uint16, len(ext_tokens))
    try:
        offsets, sizes = (np.fromiter(map(int, tokens[k::4]), np.int64, len(ext_tokens)) for k in (1, 2))
    except ValueError as exc:
        raise DatasetIndexError(f"{where}: a member's offset or size is not an integer ({exc})") from None
    return TarMembers(keys, first, exts, ext_ids, offsets, sizes)


def split_member_name(name: str) -> tuple[str, str]:
    """Split a tar member name into (key, ext) at the first dot of its last path part, as WebDataset."""
    dot = name.find(".", name.rfind("/") + 1)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :]
