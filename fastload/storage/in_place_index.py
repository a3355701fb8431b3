"""Data read where it lies (Parquet files: a folder, a file, a list, their URLs, ``hf://datasets/ORG/NAME``):
found, indexed from their footers, and that index kept and checked.

The index (:mod:`fastload.formats.parquet.footer`: each row group's rows and bytes, the columns'
roles, each file's size, mtime and footer sha256) is what ``fastload index LOCATION`` writes
beside a folder's files as ``index.json``; for anything else (a file, a list, a URL, a read-only
folder never indexed) it is built on first open from the files' footers (their last bytes only)
and kept in the cache folder (``FASTLOAD_CACHE_DIR``) under ``in-place/``, named by the location.
An index whose files changed since (another size, mtime or set of files) is rebuilt when it is the
cache's, and refused by name when it was written beside the data (``fastload index --force``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastload._util.files import atomic_write_bytes, check_relative_path, read_file, resolved_inside
from fastload.errors import DatasetIndexError
from fastload.formats.in_place_reader import class_names
from fastload.formats.in_place_reader import column_roles as in_place_roles
from fastload.formats.index import IN_PLACE_VERSION, INDEX_FILE, DatasetIndex, write_index
from fastload.formats.parquet.footer import TAIL, Footer, footer_length, parse_footer, row_groups
from fastload.formats.part_table import PartTable
from fastload.formats.shard_info import ShardInfo
from fastload.storage import remote
from fastload.storage.remote import is_url

SUFFIX = ".parquet"
SAVED_STATE = "state.json"  # datasets.save_to_disk's, beside its Arrow files (and dataset_info.json)
LANCE_VERSIONS = "_versions"  # a Lance dataset's manifests
HUB = "hf://"
CACHE_FOLDER = "in-place"
PARTS = {"parquet": "Parquet row groups", "arrow": "Arrow record batches", "lance": "Lance fragment slices"}  # a layout's shards, in words
log = logging.getLogger("fastload")


@dataclass(frozen=True)
class Located:
    """Files read in place: ``base`` (a folder, or a URL prefix) and each file's path under it;
    ``folder``: the local folder given, where ``fastload index`` writes index.json."""

    base: str
    names: tuple[str, ...]
    folder: Path | None = None
    layout: str = "parquet"  # or "arrow" (datasets.save_to_disk), "lance"

    @property
    def remote(self) -> bool:
        """Whether the files are URLs."""
        return is_url(self.base)

    @property
    def key(self) -> str:
        """What names its cached index: the files' full paths or URLs (credentials included: hashed only)."""
        return json.dumps([self.layout, self.base, *self.names])

    def file(self, name: str) -> str:
        """The path or URL of file ``name``."""
        return remote.join(self.base, name) if self.remote else os.path.join(self.base, name)


def locate(location: object, storage_options: dict | None = None) -> Located | None:
    """The Parquet files ``location`` names (a folder without index.json holding some, a ``.parquet``
    file, a list of them, their URLs, ``hf://datasets/ORG/NAME``), or None where it names none of
    them (a converted dataset, or an indexed folder: its index.json is read as any dataset's)."""
    if isinstance(location, (list, tuple)):
        return _listed([str(item) for item in location])
    if not isinstance(location, (str, os.PathLike)):
        return None
    text = str(location)
    if is_url(text):
        if any(c in text.rsplit("/", 1)[-1] for c in "*?["):  # s3://bucket/data/*.parquet: the files matching
            names = tuple(remote.glob_sizes(text, storage_options))
            if not names:
                raise FileNotFoundError(f"{remote.redact(text)}: matches no file")
            return Located(text[: min(text.index(c) for c in "*?[" if c in text)].rsplit("/", 1)[0], names)
        if text.endswith(SUFFIX):
            return _listed([text])
        if text.startswith(HUB):
            url = text.rstrip("/")
            names = tuple(remote.find_sizes(url, SUFFIX, storage_options))
            if not names:
                raise FileNotFoundError(f"{remote.redact(url)}: no {SUFFIX} files")
            return Located(url, names)
        return None
    path = Path(location)
    if path.is_file() and path.suffix == SUFFIX:
        return _listed([text])
    if not path.is_dir() or (path / INDEX_FILE).exists():
        return None
    if (path / LANCE_VERSIONS).is_dir():
        return Located(str(path.parent), (path.name,), layout="lance")
    if (path / SAVED_STATE).is_file():
        return saved_to_disk(path)
    return in_folder(path)


def saved_to_disk(path: Path) -> Located:
    """A ``datasets.save_to_disk`` folder: the Arrow stream files its state.json lists, in order."""
    try:
        state = json.loads(read_file(path / SAVED_STATE))
        names = tuple(entry["filename"] for entry in state["_data_files"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path / SAVED_STATE}: not a datasets.save_to_disk state ({type(exc).__name__})") from None
    if not names or not all(isinstance(name, str) for name in names):
        raise ValueError(f"{path / SAVED_STATE}: lists no data files")
    for name in names:
        check_relative_path(name, f"{path / SAVED_STATE}: file {name!r}")
        if resolved_inside(path, path / name) is None:
            raise ValueError(f"{path / name}: a symlink leads outside {path}; refusing to read it")
    return Located(str(path), names, path, layout="arrow")


def in_folder(path: Path) -> Located | None:
    """The Parquet files anywhere under folder ``path`` (sorted), or None where it holds none; a
    ValueError naming one that a symlink leads outside it."""
    files = sorted(f for f in path.rglob(f"*{SUFFIX}") if f.is_file())
    if not files:
        return None
    for file in files:
        if resolved_inside(path, file) is None:
            raise ValueError(f"{file}: a symlink leads outside {path}; refusing to read it")
    return Located(str(path), tuple(str(f.relative_to(path)) for f in files), path)


def _listed(items: list[str]) -> Located:
    """Files listed one by one (all paths or all URLs): under their common folder or prefix."""
    if not items:
        raise ValueError("no files given")
    urls = {is_url(item) for item in items}
    if len(urls) > 1:
        raise ValueError("give local files or URLs, not both")
    if urls == {True}:
        parents = [item.rsplit("/", 1)[0] for item in items]
        base = parents[0]
        while not all(p == base or p.startswith(base + "/") for p in parents):
            base = base.rsplit("/", 1)[0]
        return Located(base, tuple(item[len(base) + 1:] for item in items))
    paths = [os.path.abspath(item) for item in items]
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such file")
    base = os.path.commonpath([os.path.dirname(p) for p in paths])
    return Located(base, tuple(os.path.relpath(p, base) for p in paths))


def open_index(located: Located, cache_root: Path, storage_options: dict | None = None) -> DatasetIndex:
    """The index of ``located``'s files: index.json beside them (checked against the files), else the
    cache's (rebuilt when the files changed), else built now and kept in the cache."""
    if located.folder is not None and (located.folder / INDEX_FILE).exists():
        raise AssertionError("an indexed folder is opened through its index.json")  # locate() returns None for it
    cached = cached_path(located, cache_root)
    try:
        index = DatasetIndex.from_json(read_file(cached), where=str(cached))
        if not changed(located, index, storage_options):
            return index
    except (OSError, DatasetIndexError):
        pass
    start = time.perf_counter()
    index = build_index(located, storage_options)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(cached, index.to_json().encode(), durable=False)
    except OSError as exc:
        log.warning("%s: cannot keep its index in %s (%s): it is built again at each open", shown(located), cached, exc.strerror)
    log.warning("%s: indexed %d rows in %d %s in %.1fs (kept in %s; `fastload index` makes it ahead of a run)", shown(located),
                index.num_samples, len(index.shards), PARTS[located.layout], time.perf_counter() - start, cached)
    return index


def cached_path(located: Located, cache_root: Path) -> Path:
    """Where the cache keeps the index of ``located``'s files: named by a hash of their paths or URLs."""
    return cache_root / CACHE_FOLDER / (hashlib.sha256(located.key.encode()).hexdigest()[:32] + ".json")


def shown(located: Located) -> str:
    """The location as messages name it (without credentials)."""
    base = remote.redact(located.base) if located.remote else located.base
    return f"{base}/{located.names[0]}" if len(located.names) == 1 else base


def build_index(located: Located, storage_options: dict | None = None) -> DatasetIndex:
    """The index of ``located``'s files, from their footers (Parquet), their messages' headers
    (Arrow streams) or their fragments (Lance); every file's columns must be the first's, with the
    same roles. A ValueError naming the file that cannot be indexed."""
    if located.layout == "lance":
        from fastload.formats.lance.reader import lance_parts, lance_process

        shards, schema, _ = lance_process().call(lance_parts, located.file(located.names[0]), located.names[0])
        return in_place_index("lance", shards, in_place_roles(schema), schema.metadata)
    every: list[ShardInfo] = []
    columns: dict[str, str] | None = None
    metadata = None
    for name in located.names:
        check_relative_path(name, f"{shown(located)}: file {name}")
        shards, schema = _parts(located, name, storage_options)
        roles = in_place_roles(schema)
        if columns is None:
            columns, metadata = roles, schema.metadata
        elif roles != columns:
            raise ValueError(f"{located.file(name)}: its columns {roles} differ from the first file's {columns}")
        every += shards
    assert columns is not None  # names is never empty
    return in_place_index(located.layout, every, columns, metadata)


def _parts(located: Located, name: str, storage_options: dict | None) -> tuple[list[ShardInfo], Any]:
    """(the index's entries of file ``name``, its Arrow schema)."""
    where = located.file(name)
    if located.layout == "arrow":
        from fastload.formats.arrow.reader import stream_parts

        if located.remote:
            raise ValueError(f"{remote.redact(where)}: Arrow stream files are read in place from a local folder only")
        st = os.stat(where)
        return stream_parts(where, name, st.st_size, st.st_mtime_ns)
    footer, size, mtime = read_footer(located, name, storage_options)
    return row_groups(name, footer, size, mtime, remote.redact(where)), footer.meta.schema.to_arrow_schema()


def read_footer(located: Located, name: str, storage_options: dict | None = None) -> tuple[Footer, int, int | None]:
    """(footer, size, mtime_ns: None for a URL) of file ``name``: its last bytes only."""
    where = located.file(name)
    if located.remote:
        size = remote.size(where, storage_options)
        if size is None:
            raise FileNotFoundError(f"{remote.redact(where)}: not found")
        shown_as = remote.redact(where)
        length = footer_length(remote.read_range(where, size - TAIL, TAIL, storage_options) if size >= TAIL else b"", size, shown_as)
        return parse_footer(remote.read_range(where, size - length, length, storage_options), size, shown_as), size, None
    fd = os.open(where, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        length = footer_length(os.pread(fd, TAIL, st.st_size - TAIL) if st.st_size >= TAIL else b"", st.st_size, where)
        return parse_footer(os.pread(fd, length, st.st_size - length), st.st_size, where), st.st_size, st.st_mtime_ns
    finally:
        os.close(fd)


def changed(located: Located, index: DatasetIndex, storage_options: dict | None = None) -> str | None:
    """What changed in ``located``'s files since ``index`` was made (a file added, gone, of another
    size or mtime), or None: a ``stat`` a file (a URL: its size, looked up)."""
    parts = PartTable.of(index.shards)
    if located.layout == "lance":
        from fastload.formats.lance.reader import dataset_version, lance_process, listed_version

        uri = located.file(located.names[0])
        version = listed_version(uri)  # its manifests' names; else asked of pylance
        if version is None:
            version = lance_process().call(dataset_version, uri)
        return None if all(entry[5] == version for entry in parts.files) else f"its version is {version} now"
    files = {path: (file_bytes, mtime_ns) for path, file_bytes, _, mtime_ns, _, _ in parts.files}
    if set(files) != set(located.names):
        return f"its files are not those indexed ({len(located.names)} now, {len(files)} indexed)"
    for name, (file_bytes, mtime_ns) in files.items():
        where = located.file(name)
        if located.remote:
            size, mtime = remote.size(where, storage_options), None
        else:
            try:
                st = os.stat(where)
            except FileNotFoundError:
                return f"{name} is gone"
            size, mtime = st.st_size, st.st_mtime_ns
        if size != file_bytes or mtime != mtime_ns:
            return f"{name} changed since it was indexed (size or mtime)"
    return None


def check_beside(folder: Path, index: DatasetIndex) -> None:
    """A DatasetIndexError naming the folder when its files changed since ``fastload index`` wrote
    ``index``."""
    present = in_folder(folder)
    why = changed(present, index) if present is not None else "its Parquet files are gone"
    if why is not None:
        raise DatasetIndexError(f"{folder / INDEX_FILE}: {why}; run `fastload index {folder} --force` again")


def index_in_place(location: str | Path, force: bool = False) -> tuple[DatasetIndex, float, Path]:
    """``fastload index LOCATION`` for data read in place: a folder of Parquet files gets its index
    beside them as index.json (replacing one only with ``force``); a file's, a list's, a URL's, a
    ``save_to_disk`` folder's or a Lance dataset's is built anew and kept in the cache folder.
    Returns the index, the seconds it took and where it went."""
    from fastload.storage.cache import default_cache_dir

    start = time.perf_counter()
    folder = Path(location) if not is_url(location) and Path(location).is_dir() else None
    if folder is not None and (folder / INDEX_FILE).exists():
        if not force:
            raise FileExistsError(f"{folder / INDEX_FILE} exists: pass --force to replace it")
        found = in_folder(folder)
    else:
        found = locate(location)
    if found is None:
        raise FileNotFoundError(f"{location}: no {SUFFIX} files, datasets.save_to_disk folder or Lance dataset to index")
    index = build_index(found)
    if found.folder is not None and found.layout == "parquet":
        write_index(found.folder, index)
        return index, time.perf_counter() - start, found.folder / INDEX_FILE
    kept = cached_path(found, default_cache_dir())
    kept.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(kept, index.to_json().encode(), durable=False)
    return index, time.perf_counter() - start, kept


def in_place_index(layout: str, shards: list[ShardInfo], columns: Mapping[str, str], schema_metadata: Mapping[bytes, bytes] | None) -> DatasetIndex:
    """The index of data read in place: its parts as shards, its columns' roles, and the class names
    the Hub's feature description (``schema_metadata``) gives the label column (``label``, else the first)."""
    labels = [name for name, role in columns.items() if role == "label"]
    label = "label" if "label" in labels else labels[0] if labels else None
    classes = class_names(schema_metadata, label) if label is not None else None
    return DatasetIndex(layout=layout, shards=tuple(shards), fields=tuple(columns), classes=classes,
                        image_fields=tuple(name for name, role in columns.items() if role == "image"),
                        columns=dict(columns), source=f"{layout}-in-place", version=IN_PLACE_VERSION)
