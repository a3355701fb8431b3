"""``fastload index URL``: index WebDataset tars in object storage (s3://, gs://, any writable
fsspec URL) in place, as ``fastload index DIR`` does a folder: each tar is downloaded once into a
scratch folder, indexed there (its members from the headers, its sha256), its ``.idx`` and sample
table uploaded beside it and the local copy deleted; ``index.json`` is uploaded last, so a dataset is never seen
half-indexed. Two tars are in flight at a time, so the scratch folder holds at most two.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastload import remote
from fastload.converters.index_tars import IndexedTar, check_tar_name, dataset_index, tar_members, tar_sha256
from fastload.formats.idx import format_dali_index
from fastload.formats.table import TABLE_SUFFIX, tar_table
from fastload.index import INDEX_FILE, DatasetIndex, ShardInfo, write_index

TARS_IN_FLIGHT = 2


def index_remote(
    url: str, force: bool = False, storage_options: dict | None = None, scratch: str | Path | None = None
) -> tuple[DatasetIndex, float]:
    """Write a ``.idx`` beside every ``*.tar`` directly under ``url`` and then ``url/index.json``;
    refuses to replace an existing index.json unless ``force``. Returns the index and the seconds."""
    start = time.perf_counter()
    url = url.rstrip("/")
    where = remote.redact(url)
    if remote.size(remote.join(url, INDEX_FILE), storage_options) is not None and not force:
        raise FileExistsError(f"{where}/{INDEX_FILE} exists: pass --force to replace it")
    names = remote.list_names(url, ".tar", storage_options)
    if not names:
        raise FileNotFoundError(f"{where}: no .tar files to index")
    for name in names:
        check_tar_name(name, f"{where}/{name}")
    with tempfile.TemporaryDirectory(prefix="fastload-index-", dir=scratch) as tmp:
        with ThreadPoolExecutor(max_workers=TARS_IN_FLIGHT) as pool:
            done = list(pool.map(lambda name: _index_one(url, name, Path(tmp), storage_options), names))
        fields: set[str] = set()
        labels: Counter[int] = Counter()
        for _, scanned in done:
            fields |= scanned.fields
            labels.update(scanned.labels)
        index = dataset_index([shard for shard, _ in done], fields, labels)
        write_index(tmp, index)
        remote.upload(Path(tmp) / INDEX_FILE, remote.join(url, INDEX_FILE), storage_options)
    return index, time.perf_counter() - start


def _index_one(url: str, name: str, scratch: Path, storage_options: dict | None) -> tuple[ShardInfo, IndexedTar]:
    """Download one tar, index it, upload its .idx and table; the local copies are gone afterwards."""
    tar = scratch / name
    idx, table = tar.with_suffix(".idx"), tar.with_suffix(TABLE_SUFFIX)
    try:
        remote.download(remote.join(url, name), tar, None, None, storage_options)
        scanned = tar_members(tar, shown=f"{remote.redact(url)}/{name}")
        size, sha256 = tar_sha256(tar)
        idx_bytes, table_bytes = format_dali_index(scanned.samples), tar_table(tar, scanned.samples)
        for path, data in ((idx, idx_bytes), (table, table_bytes)):
            path.write_bytes(data)
            remote.upload(path, remote.join(url, path.name), storage_options)
    finally:
        for path in (tar, idx, table):
            path.unlink(missing_ok=True)
    return ShardInfo(name, len(scanned.samples), size, sha256, idx.name, hashlib.sha256(idx_bytes).hexdigest(),
                     table.name, hashlib.sha256(table_bytes).hexdigest()), scanned
