"""Check a converted dataset against its index: every shard's size, checksum and sample count,
and optionally that every image decodes. A dataset at a URL is downloaded shard by shard into a
temporary cache (checked on the way in) and checked the same way."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fastload._util.files import file_sha256, read_file
from fastload.errors import FastloadError, SampleError
from fastload.fields import decode_field, default_role, image_field
from fastload.formats.index import INDEX_FILE, DatasetIndex, read_index
from fastload.formats.shard_files import dataset_file, offsets_name, open_shard, open_shard_files, table_name
from fastload.formats.shard_formats import shard_format
from fastload.formats.shard_info import ShardInfo
from fastload.formats.shard_reader import ShardReader
from fastload.formats.table import Facts, SampleTable
from fastload.media import MEDIA_ROLES
from fastload.storage.remote import is_url


@dataclass
class VerifyReport:
    """Problems found, one line each naming the shard (and key); empty when all is well."""

    shards: int = 0
    samples: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems


def _check_shard(root: Path, index: DatasetIndex, shard: ShardInfo, decode: bool, report: VerifyReport) -> None:
    """Size and checksum of the shard (and of its .idx and sample table) against the index, then its contents;
    any failure, an unreadable file included, becomes a problem line."""
    try:
        path = dataset_file(root, shard.path)
        if not path.is_file():
            report.problems.append(f"{shard.path}: missing")
            return
        size = path.stat().st_size
        if size != shard.bytes:
            report.problems.append(f"{shard.path}: {size} bytes, index says {shard.bytes} (truncated or replaced)")
            return
        if file_sha256(path) != shard.sha256:
            report.problems.append(f"{shard.path}: sha256 mismatch (corrupted)")
            return
        if shard_format(index.layout).offsets_beside and shard.offsets_sha256 and not _file_matches(dataset_file(root, offsets_name(shard)), shard.offsets_sha256):
            report.problems.append(f"{offsets_name(shard)}: missing or sha256 mismatch (the shard's offset index is corrupted)")
            return
        table = dataset_file(root, table_name(shard))
        if shard.table_sha256 and not _file_matches(table, shard.table_sha256):
            report.problems.append(f"{table_name(shard)}: missing or sha256 mismatch (the shard's sample table is corrupted)")
            return
    except (FastloadError, OSError) as exc:
        report.problems.append(f"{shard.path}: {exc}")
        return
    tables = table if table.exists() and shard_format(index.layout).sample_tables else None
    _check_contents(lambda: open_shard(root, index, shard), shard, decode, report, bool(index.image_fields), tables)


def _check_contents(
    open_reader: Callable[[], ShardReader], shard: ShardInfo, decode: bool, report: VerifyReport, images: bool, table: Path | None
) -> None:
    """The shard's structure against the index (sample count; a tar's member headers against its
    .idx; HDF5 columns against the row count; a token shard's document table and every id below
    the tokenizer's vocabulary), its sample ``table`` against the shard (the table
    built afresh from it, byte for byte) and, with ``decode``, every field (``images``: every
    sample must have an image)."""
    try:
        reader = open_reader()
        try:
            reader.check()
            facts = recorded_facts(table, shard.samples) if table is not None else []
            if table is not None and read_file(table) != reader.sample_table(facts):
                report.problems.append(f"{table.name}: disagrees with its shard (keys, labels or offsets)")
                return
            if decode:
                _decode_all(reader, shard, report, images, facts)
        finally:
            reader.close()
    except (FastloadError, OSError) as exc:
        report.problems.append(f"{shard.path}: {exc}")
        return
    report.samples += shard.samples


def recorded_facts(table: Path, samples: int) -> list[Facts]:
    """Every sample's stream facts as the sample ``table`` records them (a ShardError when it is damaged)."""
    parsed = SampleTable(table, samples)
    try:
        return [parsed.stream_facts(i) for i in range(samples)] if parsed.schema.videos else []
    finally:
        parsed.close()


def _file_matches(path: Path, sha256: str) -> bool:
    try:
        return file_sha256(path) == sha256
    except FileNotFoundError:
        return False


def _decode_all(reader, shard: ShardInfo, report: VerifyReport, images: bool, facts: list[Facts]) -> None:
    """Read every sample and decode every field by its default role (images whole and strictly;
    labels, text, JSON and .npy arrays parsed; decoded pixels read, within the pixel limit; videos
    probed again, their stream facts compared with the table's ``facts``, every frame decoded as a
    loader decodes it); a sample that cannot be read or decoded is a problem naming it, and the
    next one is checked."""
    decoded = getattr(reader, "decoded", False)
    for i in range(len(reader)):
        where = f"{shard.path}:{reader.key(i)}"
        try:
            fields = reader.read(i)
            if decoded:
                reader.pixels(i)
        except SampleError as exc:
            report.problems.append(f"{where}: {exc.reason}")
            continue
        if images and image_field(fields) is None and not decoded:
            report.problems.append(f"{where}: no image field among {sorted(fields)}")
        for name, data in fields.items():
            try:
                recorded = facts[i].get(name) if facts else None
                if default_role(name) in MEDIA_ROLES:
                    MEDIA_ROLES[default_role(name)].check(data, where, name, recorded)
                else:
                    decode_field(default_role(name), data, where, name)
            except FastloadError as exc:
                report.problems.append(str(exc))


def verify_dataset(root: str | Path, decode: bool = False) -> VerifyReport:
    """Verify every shard listed in ``root/index.json`` (``root`` a folder or a URL); never
    raises for a bad shard, reports it."""
    from fastload.storage.in_place_index import locate

    if isinstance(root, (str, Path)) and (locate(root) is not None or _indexed_in_place(root)):
        return _verify_in_place(root, decode)
    if is_url(str(root)):
        return _verify_remote(str(root), decode)
    root = Path(root)
    index = read_index(root)
    report = VerifyReport(shards=len(index.shards))
    for shard in index.shards:
        _check_shard(root, index, shard, decode, report)
    return report


def _indexed_in_place(root: str | Path) -> bool:
    """Whether ``root`` is a local folder whose index.json is of data read in place."""
    if is_url(str(root)) or not (Path(root) / INDEX_FILE).is_file():
        return False
    return shard_format(read_index(root).layout).in_place


def _verify_in_place(root: str | Path, decode: bool) -> VerifyReport:
    """Data read in place (:mod:`fastload.storage.in_place_index`): opened as the loader opens it (the
    files checked against the index), then every row of every part read, and with ``decode`` each
    field decoded by its column's role; a problem line a part, naming its file and row."""
    from fastload.storage.dataset import ShardedDataset

    ds = ShardedDataset(root)
    report = VerifyReport(shards=len(ds.index.shards))
    for number, shard in enumerate(ds.index.shards):
        try:
            reader = ds.reader(number)
            for row in range(shard.samples):
                for name, data in reader.read(row).items():
                    if decode:
                        decode_field(ds.role(name), data, reader.key(row), name)
                report.samples += 1
        except (FastloadError, OSError, ValueError) as exc:
            report.problems.append(f"{shard.path} (part {shard.row_group}): {exc}")
    return report


def _verify_remote(url: str, decode: bool) -> VerifyReport:
    """Download each shard into a fresh temporary cache (so nothing cached earlier is trusted) and
    delete it once checked; the download checks size and sha256, then the contents are checked as
    for a local shard."""
    from fastload.storage.dataset import ShardedDataset

    with tempfile.TemporaryDirectory(prefix="fastload-verify-") as cache:
        ds = ShardedDataset(url, cache_dir=cache)
        report = VerifyReport(shards=len(ds.index.shards))
        for number, shard in enumerate(ds.index.shards):
            try:
                data, offsets = ds.fetch(number)
                table = ds.fetch_table(number)
            except (FastloadError, OSError) as exc:  # a failed download, a full disk
                report.problems.append(f"{shard.path}: {exc}")
                continue
            tables = table if ds.layout.sample_tables else None
            _check_contents(lambda: open_shard_files(ds.index, shard, data, offsets), shard, decode, report, bool(ds.index.image_fields), tables)  # noqa: B023
            for path in dict.fromkeys((data, offsets, table)):  # once each: a token shard's offsets are its table
                if path is not None:
                    path.unlink()
    return report
