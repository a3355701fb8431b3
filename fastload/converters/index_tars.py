"""``fastload index DIR``: make a folder of existing WebDataset tars (img2dataset's, any WebDataset
writer's) a fastload dataset in place: a DALI ``.idx`` and a sample table beside each tar and
``index.json`` last, the tars left untouched.

Each tar is read once: it is mapped, one thread hashes the whole mapping (hashlib releases the
GIL while it hashes) while the other parses its members' headers (one per member, through
:mod:`fastload.formats.tar_headers`, the one parser of foreign tars: it jumps from header to header
by the size field, as tar does, never touching the data), so hashing and parsing overlap and the
disk is read once. The tars are indexed in parallel by ``workers``
processes (default: one per CPU; each writes its tar's .idx and table, fsynced; the folder is
fsynced once). ``benchmarks/bench_index.py`` measures this against ``cat`` and sha256 alone.
Members are grouped into samples as webdataset does: by key, the name up to the first dot of its
last path part, consecutive members sharing one; files without an extension, hidden files and
``__*__`` metadata members are left out. Recordings (``.flac``, ``.wav``, ``.mp3``, ...) are
decoded once to record their stream facts in the sample table, as a conversion does.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fastload._util.files import atomic_write_bytes, check_relative_path, fsync_dir, open_regular, remove_temporaries
from fastload._util.processes import forked_pool
from fastload.converters.lock import locked_output
from fastload.errors import DatasetIndexError, SampleError
from fastload.fields import IMAGE_FIELDS, LABEL_FIELD, default_role, is_field_member, parse_label
from fastload.formats.idx import IDX_WHITESPACE, Member, format_dali_index, split_member_name
from fastload.formats.index import FORMAT_VERSION, INDEX_FILE, VIDEO_FORMAT_VERSION, DatasetIndex, write_index
from fastload.formats.shard_info import ShardInfo
from fastload.formats.table import MAX_LABEL_BYTES, TABLE_SUFFIX, Facts, tar_table
from fastload.formats.tar_headers import mapped, tar_members

SOURCE_NAME = "wds-index"  # the index's ``source``: tars indexed in place, not converted
UNDECODABLE_SHOWN = 5  # recordings named in the warning about those that do not decode


@dataclass
class IndexedTar:
    """One tar's members grouped into samples, the fields and the labels found."""

    samples: list[list[Member]] = field(default_factory=list)
    fields: set[str] = field(default_factory=set)
    labels: Counter[int] = field(default_factory=Counter)
    streams: bool = False  # whether its sample table records recordings' stream facts
    undecodable: list[str] = field(default_factory=list)  # "tar:member (reason)" of each recording that did not probe


def scan_tar(path: Path, shown: str | None = None) -> tuple[int, str, IndexedTar]:
    """(size, sha256, members) of a tar, its bytes read once: a thread hashes the mapping while this
    one parses the headers. A ValueError names the tar (as ``shown``, else its path; and the member
    by number) when it cannot be indexed."""
    name_shown = shown or str(path)

    def read(view: memoryview) -> tuple[int, str, IndexedTar]:
        with ThreadPoolExecutor(max_workers=1) as hasher:  # its exit waits for the hash: the view outlives it
            digest = hasher.submit(lambda: hashlib.sha256(view).hexdigest())
            out, keys = IndexedTar(), []  # type: IndexedTar, list[str]
            for number, name, offset, length in tar_members(view, name_shown):
                _add_member(out, keys, view, number, name, offset, length, name_shown)
            return len(view), digest.result(), out

    return mapped(path, read)


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
    index.json unless ``force``. One run at a time holds the folder (as a conversion holds its OUT), and
    removes the temporary files a failed or killed run left. Returns the index and the seconds it took."""
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
    with locked_output(root):  # one run at a time: what another left is no live writer's
        remove_temporaries(root, [INDEX_FILE, *(name for tar in tars for name in (tar.with_suffix(".idx").name, tar.with_suffix(TABLE_SUFFIX).name))])
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
    return info, IndexedTar(fields=scanned.fields, labels=scanned.labels, streams=scanned.streams, undecodable=scanned.undecodable)


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
    facts = recording_facts(tar, scanned.samples, scanned.undecodable)
    scanned.streams = any(facts)
    files = {idx: format_dali_index(scanned.samples), table: tar_table(tar, scanned.samples, facts)}
    info = ShardInfo(tar.name, len(scanned.samples), size, sha256, idx.name, hashlib.sha256(files[idx]).hexdigest(),
                     table.name, hashlib.sha256(files[table]).hexdigest())
    return info, files


def recording_facts(tar: Path, samples: list[list[Member]], undecodable: list[str]) -> list[Facts]:
    """Each sample's stream facts, each member of a media role that is probed in place probed
    (fastload.media's ``probe_in_place``: recordings); one that does not probe gets none, so
    loading it is a bad sample that says so, and is named in ``undecodable`` with its reason."""
    from fastload.media import MEDIA_ROLES

    probes = {role: media.probe_in_place for role, media in MEDIA_ROLES.items() if media.probe_in_place is not None}
    wanted = [[(ext, offset, size, name, probes[default_role(ext)]) for ext, offset, size, name in members if default_role(ext) in probes]
              for members in samples]
    if not any(wanted):
        return []
    facts: list[Facts] = []
    fd = open_regular(tar)
    try:
        for recordings in wanted:
            found: Facts = {}
            for ext, offset, size, name, probe in recordings:
                try:
                    found[ext] = probe(os.pread(fd, size, offset) if size > 0 else b"", f"{tar.name}:{name}")
                except SampleError as exc:
                    undecodable.append(f"{tar.name}:{name} ({exc.reason})")
            facts.append(found)
    finally:
        os.close(fd)
    return facts


def dataset_index(shards: list[ShardInfo], scans: list[IndexedTar]) -> DatasetIndex:
    """The index of tars indexed in place: their shards, and the fields and labels found in them.
    Recordings that did not decode stay in it (loading one is a bad sample that names it): a
    warning counts them and names the first few."""
    undecodable = [entry for scanned in scans for entry in scanned.undecodable]
    if undecodable:
        shown = "; ".join(undecodable[:UNDECODABLE_SHOWN]) + ("; ..." if len(undecodable) > UNDECODABLE_SHOWN else "")
        warnings.warn(f"{len(undecodable)} recording(s) do not decode and have no stream facts (loading one is a bad "
                      f"sample; on_error='skip' skips it): {shown}", stacklevel=3)
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
        version=VIDEO_FORMAT_VERSION if any(scanned.streams for scanned in scans) else FORMAT_VERSION,
    )


def _write_file(path: Path, data: bytes) -> None:
    """``path`` replaced atomically by ``data``, fsynced (the folder is fsynced once by the caller)."""
    atomic_write_bytes(path, data, sync_folder=False)
