"""The contract between shard writers and readers: a versioned ``index.json`` at the dataset root.

Writers (``converters``) produce it last, after every shard is complete; readers (the loader,
``inspect``, ``verify``) trust nothing else about a dataset. Per-sample byte offsets of tar shards
live beside each shard in DALI's ``.idx`` format (see :func:`write_dali_index`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from dataclasses import MISSING, asdict, dataclass, field, fields as dataclass_fields
from pathlib import Path
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


MAX_INT = 2**63 - 1  # counts, sizes and labels all fit an int64
_PATH_PART = re.compile(r"[A-Za-z0-9_.+=,@-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def check_relative_path(value: object, name: str) -> str:
    """``value`` if it is a path confined to the dataset root / URL prefix: '/'-separated parts of
    ASCII letters, digits and ``._+=,@-``, none empty, ``.`` or ``..`` (so no absolute path,
    backslash, NUL, ``%``, ``?`` or ``#`` either); else a DatasetIndexError naming field ``name``."""
    if not isinstance(value, str) or not all(
        part not in (".", "..") and _PATH_PART.fullmatch(part) for part in value.split("/")
    ):
        raise DatasetIndexError(
            f"{name}: must be a relative path inside the dataset ('/'-separated parts of letters, digits "
            "and ._+=,@-; no empty, '.' or '..' part)"
        )
    return value


def is_sha256(value: object) -> bool:
    """Whether ``value`` is a sha256 hex digest as the writers record it (64 lowercase hex digits)."""
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def _check_sha256(value: object, name: str, optional: bool = False) -> None:
    if not (is_sha256(value) or (optional and value is None)):
        raise DatasetIndexError(f"{name}: must be a sha256 digest (64 lowercase hex digits)")


def _check_int(value: object, name: str, minimum: int = 0) -> None:
    """An int (bool is not one) from ``minimum`` to 2**63 - 1."""
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_INT:
        raise DatasetIndexError(f"{name}: must be an integer from {minimum} to 2**63 - 1")


def _check_strings(value: object, name: str) -> None:
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise DatasetIndexError(f"{name}: must be a list of strings")


def _check_counts(value: object, name: str) -> None:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise DatasetIndexError(f"{name}: must be an object of counts")
    for count in value.values():
        _check_int(count, name)


@dataclass(frozen=True)
class ShardInfo:
    """One shard file: its path relative to the dataset root, sample count, size and checksum.
    Every field is checked with its type on construction, so readers trust them afterwards."""

    path: str
    samples: int
    bytes: int
    sha256: str
    offsets: str | None = None  # the DALI .idx beside a tar shard
    offsets_sha256: str | None = None  # its checksum (fetched .idx files are checked too)

    def __post_init__(self) -> None:
        check_relative_path(self.path, "path")
        _check_int(self.samples, "samples")
        _check_int(self.bytes, "bytes")
        _check_sha256(self.sha256, "sha256")
        if self.offsets is not None:
            check_relative_path(self.offsets, "offsets")
        _check_sha256(self.offsets_sha256, "offsets_sha256", optional=True)


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
        """Check every field with its type (an index may come from anyone)."""
        if self.format != FORMAT_NAME:
            raise DatasetIndexError("format: not a fastload index")
        _check_int(self.version, "version")
        if self.version not in READABLE_VERSIONS:
            raise DatasetIndexError(
                f"index version {self.version} is not supported (this fastload reads {READABLE_VERSIONS})"
            )
        if self.layout not in LAYOUTS:
            raise DatasetIndexError(f"layout: must be one of {LAYOUTS}")
        if not isinstance(self.shards, tuple) or not all(isinstance(s, ShardInfo) for s in self.shards):
            raise DatasetIndexError("shards: must be a list of shards")
        _check_strings(self.fields, "fields")
        _check_strings(self.image_fields, "image_fields")
        if self.classes is not None:
            _check_strings(self.classes, "classes")
        _check_counts(self.class_counts, "class_counts")
        _check_counts(self.skipped, "skipped")
        _check_int(self.duplicates, "duplicates")
        if not isinstance(self.source, str):
            raise DatasetIndexError("source: must be a string")
        if not isinstance(self.conversion, dict):
            raise DatasetIndexError("conversion: must be an object")
        if self.decoded_shape is not None:
            if self.layout != "hdf5":
                raise DatasetIndexError("decoded_shape: only an hdf5 dataset holds decoded pixels")
            if not isinstance(self.decoded_shape, tuple) or len(self.decoded_shape) != 3:
                raise DatasetIndexError("decoded_shape: must be [height, width, channels]")
            for side in self.decoded_shape:
                _check_int(side, "decoded_shape", minimum=1)
        if self.num_samples > MAX_INT:
            raise DatasetIndexError("shards: more than 2**63 - 1 samples in all")

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
    def from_json(cls, text: str | bytes, where: str = INDEX_FILE) -> "DatasetIndex":
        """Parse and validate index.json; ``where`` names the file in errors, which name the field
        that is wrong but never repeat what the file holds."""
        try:
            data = json.loads(text.decode() if isinstance(text, bytes) else text)
        except UnicodeDecodeError as exc:
            raise DatasetIndexError(f"{where}: not UTF-8 text (at byte {exc.start})") from None
        except (ValueError, RecursionError) as exc:  # JSONDecodeError says where, not what
            raise DatasetIndexError(f"{where}: not JSON ({type(exc).__name__}: {exc})") from None
        try:
            _check_keys(cls, data, "the index")
            total = data.pop("num_samples", None)
            if not isinstance(data.get("shards"), list):
                raise DatasetIndexError("shards: must be a list of shards")
            shards = []
            for number, shard in enumerate(data["shards"]):
                _check_keys(ShardInfo, shard, f"shards[{number}]")
                try:
                    shards.append(ShardInfo(**shard))
                except DatasetIndexError as exc:
                    raise DatasetIndexError(f"shards[{number}].{exc}") from None
            data["shards"] = tuple(shards)
            for name in ("fields", "image_fields", "classes", "decoded_shape"):
                data[name] = _as_tuple(data.get(name))
            data["image_fields"] = data["image_fields"] or ()  # absent or null: none
            index = cls(**data)
            if total is not None:
                _check_int(total, "num_samples")
                if total != index.num_samples:
                    raise DatasetIndexError(f"num_samples: says {total}, the shards hold {index.num_samples}")
            return index
        except DatasetIndexError as exc:
            raise DatasetIndexError(f"{where}: {exc}") from None


def _check_keys(cls: type, data: object, name: str) -> None:
    """That ``data`` is a JSON object holding ``cls``'s required fields and no others (counted, not
    repeated: they are the file's content)."""
    if not isinstance(data, dict):
        raise DatasetIndexError(f"{name}: must be an object")
    known = {f.name for f in dataclass_fields(cls)} | ({"num_samples"} if cls is DatasetIndex else set())
    unknown = sum(1 for key in data if key not in known)
    if unknown:
        raise DatasetIndexError(f"{name}: {unknown} unknown field(s)")
    required = [f.name for f in dataclass_fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    missing = [key for key in required if key not in data]
    if missing:
        raise DatasetIndexError(f"{name}: missing {', '.join(missing)}")


def _as_tuple(value: object) -> object:
    """A JSON list as a tuple; anything else (null included) as it is, for the dataclass to check."""
    return tuple(value) if isinstance(value, list) else value


def read_index(root: str | os.PathLike[str]) -> DatasetIndex:
    """Read ``ROOT/index.json``; raises :class:`DatasetIndexError` naming the file when it is unusable."""
    path = Path(root) / INDEX_FILE
    try:
        data = read_file(path)
    except FileNotFoundError:
        raise DatasetIndexError(
            f"{path}: no index.json — not a converted dataset, or its conversion has not finished"
        ) from None
    except OSError as exc:
        raise DatasetIndexError(f"{path}: cannot read it ({exc.strerror})") from None
    return DatasetIndex.from_json(data, where=str(path))


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of ``path``; an OSError unless it is a regular file (a FIFO would
    block the reader, a directory or device is no dataset file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # O_NONBLOCK: opening a FIFO does not wait
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OSError(errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL, "not a regular file", str(path))
    return fd


def read_file(path: str | os.PathLike[str]) -> bytes:
    """The whole of a regular file (see :func:`open_regular`)."""
    with os.fdopen(open_regular(path), "rb") as f:
        return f.read()


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
    with os.fdopen(open_regular(path), "rb") as f:
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

    def samples_outside(self, size: int) -> frozenset[int]:
        """Samples with a member not wholly inside the first ``size`` bytes (negative offset or
        size, or past the end): checked once when a shard opens, so reads need no bounds check."""
        offsets = np.frombuffer(self._offsets, np.int64)
        sizes = np.frombuffer(self._sizes, np.int64)
        bad = (offsets < 0) | (sizes < 0) | (sizes > size - offsets)  # no overflow: both within int64
        owners = np.searchsorted(np.frombuffer(self._first, np.int64), np.flatnonzero(bad), side="right") - 1
        return frozenset(owners.tolist())

    def members(self) -> list[tuple[str, int, int]]:
        """Every member as (name, data offset, size), in .idx order."""
        exts, ext_ids = self._exts, self._ext_ids
        owners = np.repeat(np.arange(len(self)), np.diff(np.frombuffer(self._first, np.int64))).tolist()
        return [
            (self.key(owner) + (f".{exts[ext_ids[m]]}" if exts[ext_ids[m]] else ""), self._offsets[m], self._sizes[m])
            for m, owner in enumerate(owners)
        ]


_DALI_HEADER = re.compile(rf"{re.escape(DALI_INDEX_VERSION)} +([0-9]{{1,18}}) *")


def parse_dali_index(text: str, where: str) -> TarMembers:
    """Parse a DALI v1.2 index (one sample a line, four tokens a member) into :class:`TarMembers`;
    a DatasetIndexError names ``where`` and the line, never what the file holds."""
    head, _, body = text.partition("\n")
    if not head.strip():
        raise DatasetIndexError(f"{where}: empty DALI index")
    header = _DALI_HEADER.fullmatch(head.strip())
    if header is None:
        raise DatasetIndexError(f"{where}: expected a '{DALI_INDEX_VERSION} N' header on the first line")
    lines = body.splitlines()
    tokens_per_line = np.fromiter(map(len, map(str.split, lines)), np.int64, len(lines))
    malformed = np.flatnonzero((tokens_per_line == 0) | (tokens_per_line % 4 != 0))
    if malformed.size:
        raise DatasetIndexError(f"{where}:{int(malformed[0]) + 2}: malformed sample line")
    if len(lines) != int(header[1]):
        raise DatasetIndexError(f"{where}: header says {int(header[1])} samples, found {len(lines)}")
    tokens = body.split()
    first = np.zeros(len(lines) + 1, np.int64)
    np.cumsum(tokens_per_line // 4, out=first[1:])
    names = tokens[3::4]
    keys = [split_member_name(names[m])[0] for m in first[:-1].tolist()]
    ext_tokens = tokens[0::4]
    exts = list(dict.fromkeys(ext_tokens))
    if len(exts) > np.iinfo(np.uint16).max:
        raise DatasetIndexError(f"{where}: more than {np.iinfo(np.uint16).max} different field names")
    ext_ids = np.fromiter(map({ext: e for e, ext in enumerate(exts)}.__getitem__, ext_tokens), np.uint16, len(ext_tokens))
    try:
        offsets, sizes = (np.fromiter(map(int, tokens[k::4]), np.int64, len(ext_tokens)) for k in (1, 2))
    except ValueError:
        raise DatasetIndexError(f"{where}: a member's offset or size is not an integer") from None
    except OverflowError:
        raise DatasetIndexError(f"{where}: a member's offset or size is beyond the int64 range") from None
    return TarMembers(keys, first, exts, ext_ids, offsets, sizes)


def split_member_name(name: str) -> tuple[str, str]:
    """Split a tar member name into (key, ext) at the first dot of its last path part, as WebDataset."""
    dot = name.find(".", name.rfind("/") + 1)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :]
