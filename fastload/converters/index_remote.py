"""``fastload index URL``: index WebDataset tars in object storage (s3://, gs://, any writable
fsspec URL) in place, as ``fastload index DIR`` does a folder: each tar is downloaded once into a
scratch folder, indexed there (its members from the headers, its sha256), its ``.idx`` and sample
table uploaded beside it and the local copy deleted; ``index.json`` is uploaded last, so a dataset is never seen
half-indexed. Two tars are in flight at a time, so the scratch folder holds at most two.
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastload._util.files import atomic_write_bytes
from fastload.converters.index_tars import IndexedTar, check_tar_name, dataset_index, indexed_shard, scan_tar
from fastload.formats.index import INDEX_FILE, DatasetIndex, write_index
from fastload.formats.shard_info import ShardInfo
from fastload.storage import remote

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
    sizes = remote.list_sizes(url, ".tar", storage_options)
    names = list(sizes)
    if not names:
        raise FileNotFoundError(f"{where}: no .tar files to index")
    for name in names:
        check_tar_name(name, f"{where}/{name}")
    with tempfile.TemporaryDirectory(prefix="fastload-index-", dir=scratch) as tmp:
        with ThreadPoolExecutor(max_workers=TARS_IN_FLIGHT) as pool:
            done = list(pool.map(lambda name: _index_one(url, name, sizes[name], Path(tmp), storage_options), names))
        index = dataset_index([shard for shard, _ in done], [scanned for _, scanned in done])
        write_index(tmp, index)
        remote.upload(Path(tmp) / INDEX_FILE, remote.join(url, INDEX_FILE), storage_options)
    return index, time.perf_counter() - start


def _index_one(url: str, name: str, size: int, scratch: Path, storage_options: dict | None) -> tuple[ShardInfo, IndexedTar]:
    """Download one tar (cut off past the ``size`` its listing gives), index it, upload its .idx
    and table; the local copies are gone afterwards."""
    tar = scratch / name
    files: dict[Path, bytes] = {}
    try:
        remote.download(remote.join(url, name), tar, None, size, storage_options)
        size, sha256, scanned = scan_tar(tar, shown=f"{remote.redact(url)}/{name}")
        info, files = indexed_shard(tar, scanned, size, sha256)
        for path, data in files.items():
            atomic_write_bytes(path, data, durable=False)
            remote.upload(path, remote.join(url, path.name), storage_options)
    finally:
        for path in (tar, *files):
            path.unlink(missing_ok=True)
    return info, scanned
