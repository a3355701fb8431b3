"""Per-sample tables: one small binary file beside each shard (``shard-00000.table``) holding
every sample's key, label and each field's (data offset, size), so a reader holds nothing per
sample in memory: a sample's row is one ``pread`` (the page cache keeps one copy for every
worker and rank of a node), and whole columns (labels, key hashes) are one read per shard.

Format (every integer little-endian; written by the converters, by ``fastload index``, and on
first open of an older dataset). Version 1 (magic ``FLTABLE1``) holds no video; version 2
(``FLTABLE2``) is version 1 plus each video's stream facts (:mod:`fastload.av.facts`), written
only where a shard holds videos, so a dataset without video keeps version-1 tables that any
fastload reads, and an older fastload refuses a video dataset at its index.json (version 4)
rather than misreading a table:

======================  =====================================================================
bytes 0-7               magic ``b"FLTABLE1"``
8-15, 16-23             N samples (uint64), F field columns (uint64)
24-31, 32-39            names bytes (uint64, a multiple of 8), keys bytes (uint64)
40-47, 48-55, 56-63     version 2: V video (or audio) fields, K keyframes in all, video names bytes (uint64,
                        a multiple of 8); version 1: zero
names                   F field names (UTF-8), each ending in NUL, zero-padded to a multiple of 8
rows                    N rows of 2 + 2F int64: key start, key end, then (offset, size) per field;
                        size -1: the sample lacks that field
labels                  N int64: the ``cls`` label, -1 where there is none (or it is no integer)
key hashes              N uint64: the first 8 bytes of blake2b(key) (for lookups by key)
keys                    the keys' UTF-8 bytes, concatenated
video names             version 2: the V video fields' names, as the field names are stored
facts                   version 2: N x V rows of 14 int64 (frames, width, height, rate and time
                        base as fractions, first timestamp, first keyframe and keyframe count in
                        the keyframes, audio rate and channels, the codec's name in 16 bytes);
                        frames -1: the sample lacks that field. An audio field's row (a
                        recording, fastload.av.facts.AudioFacts) has width 0, then (packets, 0,
                        channels, sample rate, samples, time base, first timestamp, 0, 0,
                        seekable, 0, codec): fastload.av.facts.facts_row is the one writer
keyframes               version 2: K pairs of int64 (frame number, timestamp)
======================  =====================================================================
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import struct
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from fastload._util.files import close_when_dropped, open_in_root, open_regular, this_process
from fastload.av.facts import FACT_COLUMNS, MediaFacts, facts_from_row, facts_row
from fastload.errors import SampleError, ShardError
from fastload.fields import LABEL_FIELD, parse_label
from fastload.formats.idx import Member, split_member_name

TABLE_MAGIC = b"FLTABLE1"
VIDEO_TABLE_MAGIC = b"FLTABLE2"  # version 2: with videos' stream facts
TABLE_SUFFIX = ".table"
_HEADER = struct.Struct("<8sQQQQQQQ")
NO_FACTS = -1  # frames of a sample lacking the video field
MAX_FIELDS = 4096
MAX_LABEL_BYTES = 32  # a longer cls member is no label a table records

ABSENT = -1  # the size of a field the sample lacks
BAD_SIZE = -2  # a negative size given for a field (a hostile .idx): kept, so reading it is refused
Spans = dict[str, tuple[int, int]]
Facts = dict[str, MediaFacts]  # a sample's videos' and recordings' stream facts by field name


def key_hashes(keys: Iterable[str]) -> np.ndarray:
    """Each key's lookup hash (uint64): the first 8 bytes of its UTF-8 blake2b, little-endian."""
    digests = b"".join(hashlib.blake2b(key.encode(), digest_size=8).digest() for key in keys)
    return np.frombuffer(digests, dtype="<u8")


def _names_section(names: Sequence[str]) -> bytes:
    """Names, each ending in NUL, zero-padded to a multiple of 8 bytes."""
    data = b"".join(name.encode() + b"\0" for name in names)
    return data + bytes(-len(data) % 8)


def _facts_sections(facts: Sequence[Facts]) -> tuple[list[str], bytes, int]:
    """(the media fields' names, the media names + facts rows + keyframes sections, keyframes in all)."""
    videos = sorted({name for sample in facts for name in sample})
    rows = np.zeros((len(facts), len(videos), FACT_COLUMNS), dtype="<i8")
    rows[:, :, 0] = NO_FACTS
    pairs: list[tuple[int, int]] = []
    for i, sample in enumerate(facts):
        for v, name in enumerate(videos):
            f = sample.get(name)
            if f is None:
                continue
            rows[i, v], own = facts_row(f, len(pairs))
            pairs += own
    keyframes = np.asarray(pairs, dtype="<i8").reshape(len(pairs), 2)
    return videos, _names_section(videos) + rows.tobytes() + keyframes.tobytes(), len(pairs)


def encode_table(keys: Sequence[str], spans: Sequence[Spans], labels: Sequence[int] | np.ndarray, facts: Sequence[Facts] = ()) -> bytes:
    """The table of a shard whose sample i has key ``keys[i]``, fields ``spans[i]`` ({name:
    (data offset, size)}), label ``labels[i]`` (-1: none) and, where the shard holds videos,
    their stream facts ``facts[i]`` (then the table is version 2)."""
    names = sorted({name for sample in spans for name in sample})
    column = {name: c for c, name in enumerate(names)}
    encoded = [key.encode() for key in keys]
    rows = np.zeros((len(keys), 2 + 2 * len(names)), dtype="<i8")
    rows[:, 3::2] = ABSENT  # every field absent until its span is set
    lengths = np.array([len(k) for k in encoded], dtype=np.int64)
    rows[:, 1] = np.cumsum(lengths)
    rows[:, 0] = rows[:, 1] - lengths
    for i, sample in enumerate(spans):
        for name, (offset, size) in sample.items():
            rows[i, 2 + 2 * column[name]] = offset
            rows[i, 3 + 2 * column[name]] = size if size >= 0 else BAD_SIZE
    name_bytes = _names_section(names)
    key_bytes = b"".join(encoded)
    videos, video_bytes, keyframes = _facts_sections(facts) if any(facts) else ([], b"", 0)
    magic = VIDEO_TABLE_MAGIC if videos else TABLE_MAGIC
    header = _HEADER.pack(magic, len(keys), len(names), len(name_bytes), len(key_bytes), len(videos), keyframes, len(_names_section(videos)))
    label_column = np.asarray(labels, dtype="<i8").reshape(len(keys))
    return b"".join((header, name_bytes, rows.tobytes(), label_column.tobytes(), key_hashes(keys).tobytes(), key_bytes, video_bytes))


def tar_table(tar: Path, samples: Sequence[list[Member]], facts: Sequence[Facts] = ()) -> bytes:
    """The table of a tar shard from its ``.idx`` members (as the writers and the ``.idx`` parser
    list them) and its videos' stream facts; labels are read from each sample's ``cls`` member."""
    keys = [split_member_name(members[0][3])[0] for members in samples]
    spans = [{ext: (offset, size) for ext, offset, size, _ in members} for members in samples]
    return encode_table(keys, spans, tar_labels(tar, keys, spans), facts)


def tar_labels(tar: str | Path, keys: Sequence[str], spans: Sequence[Spans]) -> list[int]:
    """Each sample's ``cls`` label read from the tar (-1 where it has none, or none that parses)."""
    labels = [-1] * len(spans)
    try:
        fd = open_regular(tar)
    except OSError as exc:
        raise ShardError(f"{tar}: cannot open shard ({exc.strerror})") from None
    try:
        for i, sample in enumerate(spans):
            offset, size = sample.get(LABEL_FIELD, (0, -1))
            if 0 <= size <= MAX_LABEL_BYTES:
                with contextlib.suppress(SampleError):
                    labels[i] = parse_label(os.pread(fd, size, offset), f"{tar}:{keys[i]}")
    finally:
        os.close(fd)
    return labels


HEAD_READ = 512  # a table's first read: the header and, for any usual set of fields, their names


@functools.lru_cache(maxsize=64)
def _row_struct(fields: int) -> struct.Struct:
    return struct.Struct(f"<{2 + 2 * fields}q")


@functools.lru_cache(maxsize=64)
def _field_names(raw: bytes, fields: int) -> tuple[str, ...] | str:
    """The ``fields`` names in a table's names section, else what is wrong with it (the shards
    of a dataset share one: it is parsed once)."""
    names = raw.rstrip(b"\0").split(b"\0") if fields else []
    try:
        decoded = tuple(name.decode() for name in names)
    except UnicodeDecodeError:
        return "its field names are not UTF-8"
    if len(decoded) != fields or len(set(decoded)) != fields or not all(decoded):
        return "a damaged header (field names)"
    return decoded


@functools.lru_cache(maxsize=64)
def _row_fields(names: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """Each field's name and the place of its offset in a row."""
    return tuple((name, 2 + 2 * c) for c, name in enumerate(names))


class TableSchema(NamedTuple):
    """Where a table's sections lie, from its header (checked against the file's size); a named
    tuple, as a frozen dataclass's construction cost a shard's first open ~1.5 us."""

    samples: int
    names: tuple[str, ...]
    rows_at: int
    labels_at: int
    hashes_at: int
    keys_at: int
    keys_bytes: int
    videos: tuple[str, ...] = ()  # version 2: the fields whose stream facts it holds
    facts_at: int = 0
    keyframes_at: int = 0
    keyframes: int = 0

    @property
    def row(self) -> struct.Struct:
        """One row's schema."""
        return _row_struct(len(self.names))

    @classmethod
    def parse(cls, read: Callable[[int, int], bytes], size: int, samples: int, where: str) -> TableSchema:
        """The schema of a table file of ``size`` bytes (``read(offset, n)`` reads it, at most
        twice: the header with the usual names, then longer names), for a shard the index says holds ``samples``."""
        head = read(0, min(size, HEAD_READ))
        if size < _HEADER.size or head[:8] not in (TABLE_MAGIC, VIDEO_TABLE_MAGIC):
            raise ShardError(f"{where}: not a fastload sample table (bad magic)")
        magic, count, fields, names_bytes, keys_bytes, videos, keyframes, video_names_bytes = _HEADER.unpack_from(head)
        if magic == TABLE_MAGIC and (videos or keyframes or video_names_bytes):
            raise ShardError(f"{where}: a damaged header (a version 1 table listing videos)")
        if count != samples:
            raise ShardError(f"{where}: lists {count} samples, the index says its shard holds {samples}")
        if fields > MAX_FIELDS or names_bytes % 8 or names_bytes > 64 * MAX_FIELDS:
            raise ShardError(f"{where}: a damaged header (field names)")
        rows_at = _HEADER.size + names_bytes
        labels_at = rows_at + count * (2 + 2 * fields) * 8
        hashes_at = labels_at + count * 8
        keys_at = hashes_at + count * 8
        if (magic == VIDEO_TABLE_MAGIC) != (videos > 0) or videos > fields or video_names_bytes % 8 or video_names_bytes > 64 * MAX_FIELDS:
            raise ShardError(f"{where}: a damaged header (video fields)")
        names_at = keys_at + keys_bytes
        raw = head[_HEADER.size : rows_at] if rows_at <= len(head) else read(_HEADER.size, names_bytes)
        names = _field_names(raw, fields)
        if isinstance(names, str):
            raise ShardError(f"{where}: {names}")
        if not videos:
            if names_at != size:
                raise ShardError(f"{where}: its header describes {names_at} bytes, the file holds {size} (truncated or tampered)")
            return cls(count, names, rows_at, labels_at, hashes_at, keys_at, keys_bytes)
        facts_at = names_at + video_names_bytes
        keyframes_at = facts_at + count * videos * FACT_COLUMNS * 8
        if keyframes_at + keyframes * 16 != size:
            raise ShardError(f"{where}: its header describes {keyframes_at + keyframes * 16} bytes, the file holds {size} (truncated or tampered)")
        video_names = _field_names(read(names_at, video_names_bytes), videos)
        if isinstance(video_names, str) or not set(video_names) <= set(names):
            raise ShardError(f"{where}: a damaged header (video field names)")
        return cls(count, names, rows_at, labels_at, hashes_at, keys_at, keys_bytes, video_names, facts_at, keyframes_at, keyframes)


class _Missing(ShardError):
    """No table file where one was looked for."""


class SampleTable:
    """A shard's table read by ``pread``: nothing per sample is held in memory. Opened by
    :meth:`open`, closed by :meth:`close` (its schema stays, so reopening reads no header);
    ``data`` holds a table built in memory (a read-only folder) instead of a file. Opening one
    costs an ``open``, an ``fstat`` and one ``pread`` (a shard's first read pays it)."""

    def __init__(self, path: str | Path, samples: int, data: bytes | None = None, root: str | None = None) -> None:
        self.path = path
        self.root = root  # the dataset's folder: its file is opened by open_in_root
        self._data = data
        self._fd: int | None = None
        self._pid = -1
        self._row_cache: tuple[int, tuple[int, ...]] = (-1, ())
        size = len(data) if data is not None else self._open_file()[1]
        self.schema = TableSchema.parse(self._read, size, samples, str(path))
        self._row = self.schema.row
        self._fields = _row_fields(self.schema.names)

    def __len__(self) -> int:
        return self.schema.samples

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fd"], state["_pid"], state["_row"], state["_closer"] = None, -1, None, None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._row = self.schema.row

    @classmethod
    def found(cls, path: str | Path, samples: int, root: str | None = None) -> SampleTable | None:
        """The table at ``path``, None where there is no such file (its ``open`` says so: no ``stat`` first)."""
        try:
            return cls(path, samples, root=root)
        except _Missing:
            return None

    def _open_file(self) -> tuple[int, int]:
        """Open the file in this process: (its descriptor, its size)."""
        try:
            fd, size, self.path = open_in_root(self.path, self.root)
        except OSError as exc:
            error = _Missing if isinstance(exc, FileNotFoundError) else ShardError
            raise error(f"{self.path}: cannot open the sample table ({exc.strerror})") from None
        self._fd, self._pid, self._closer = fd, this_process(), close_when_dropped(self, fd)
        return fd, size

    def _descriptor(self) -> int:
        if self._fd is None or self._pid != this_process():  # never share a descriptor across a fork
            return self._open_file()[0]
        return self._fd

    def _read(self, offset: int, size: int) -> bytes:
        if self._data is not None:
            return self._data[offset : offset + size]
        data = os.pread(self._descriptor(), size, offset)
        if len(data) != size:
            raise ShardError(f"{self.path}: cut short (truncated since it was opened?)")
        return data

    def open(self) -> None:
        """Open the file in this process now."""
        if self._data is None:
            self._descriptor()

    def _values(self, i: int) -> tuple[int, ...]:
        cached, values = self._row_cache
        if cached != i:
            values = self._row.unpack(self._read(self.schema.rows_at + i * self._row.size, self._row.size))
            self._row_cache = (i, values)
        return values

    def key(self, i: int) -> str:
        """The key of sample ``i``."""
        start, end = self._values(i)[:2]
        if not 0 <= start <= end <= self.schema.keys_bytes:
            raise ShardError(f"{self.path}: row {i}'s key lies outside the keys (tampered?)")
        try:
            return self._read(self.schema.keys_at + start, end - start).decode()
        except UnicodeDecodeError:
            raise ShardError(f"{self.path}: row {i}'s key is not UTF-8") from None

    def spans(self, i: int) -> Spans:
        """Each field of sample ``i``: {name: (data offset, size)}."""
        values = self._values(i)
        return {name: (values[at], values[at + 1]) for name, at in self._fields if values[at + 1] != ABSENT}

    def labels(self) -> np.ndarray:
        """Every sample's label (int64, -1 where none)."""
        return np.frombuffer(self._read(self.schema.labels_at, 8 * len(self)), dtype="<i8").astype(np.int64)

    def hashes(self) -> np.ndarray:
        """Every sample's key hash (see :func:`key_hashes`)."""
        return np.frombuffer(self._read(self.schema.hashes_at, 8 * len(self)), dtype="<u8")

    def keys(self) -> list[str]:
        """Every sample's key."""
        rows = np.frombuffer(self._read(self.schema.rows_at, self._row.size * len(self)), dtype="<i8").reshape(len(self), self._row.size // 8)
        blob = self._read(self.schema.keys_at, self.schema.keys_bytes)
        starts, ends = rows[:, 0].tolist(), rows[:, 1].tolist()
        if any(not 0 <= s <= e <= len(blob) for s, e in zip(starts, ends)):
            raise ShardError(f"{self.path}: a key lies outside the keys (tampered?)")
        try:
            return [blob[s:e].decode() for s, e in zip(starts, ends)]
        except UnicodeDecodeError:
            raise ShardError(f"{self.path}: a key is not UTF-8") from None

    def stream_facts(self, i: int) -> Facts:
        """The stream facts of each video of sample ``i`` (empty: the table holds no video), checked
        against the table's bounds: a damaged row is a ShardError naming the table."""
        schema = self.schema
        if not schema.videos:
            return {}
        row_bytes = len(schema.videos) * FACT_COLUMNS * 8
        rows = np.frombuffer(self._read(schema.facts_at + i * row_bytes, row_bytes), dtype="<i8").reshape(len(schema.videos), FACT_COLUMNS)
        out: Facts = {}
        for name, row in zip(schema.videos, rows.tolist()):
            if row[0] == NO_FACTS:
                continue

            def keyframes(first: int, count: int) -> list[tuple[int, int]]:
                if not (first >= 0 and count > 0 and first + count <= schema.keyframes):
                    raise ShardError(f"{self.path}: row {i}'s keyframes lie outside the table (tampered?)")
                pairs = np.frombuffer(self._read(schema.keyframes_at + first * 16, count * 16), dtype="<i8").reshape(count, 2)
                return [(int(a), int(b)) for a, b in pairs.tolist()]

            try:
                out[name] = facts_from_row(row, keyframes)
            except ValueError:
                raise ShardError(f"{self.path}: row {i}'s stream facts for {name} are inconsistent (tampered?)") from None
        return out

    def close(self) -> None:
        """Close the descriptor of this process."""
        if self._fd is not None and self._pid == this_process():
            self._closer()
        self._fd = None
        self._row_cache = (-1, ())
