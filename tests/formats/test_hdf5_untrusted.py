"""HDF5 shards from strangers (#33): a column reached through a soft or external link, stored in an
external file or mapped from others as a virtual dataset is refused by name before any column is
read (an external caption file came back as captions; ``/proc/self/environ`` as a key reached a
message); and what a read may allocate is checked before it happens: a tiny shard declaring a
hidden 1 GiB compressed column, a 1 GiB value or 20000x20000 decoded pixels ends in a SampleError
naming the sample and field (skippable), in bounded memory (each load runs under RLIMIT_AS), and
a column nobody asked for is never read."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

import fastload
from fastload import transforms as T
from fastload.errors import ShardError
from fastload.formats.hdf5.reader import MAX_DECOMPRESSED_BYTES
from fastload.formats.hdf5.writer import Hdf5ShardWriter
from fastload.formats.index import DatasetIndex, read_index, write_index
from fastload.formats.writing import PreparedSample, WriterOptions
from tests.conftest import jpeg_bytes, run_cli, small_photo
from tests.hostile_data import run_limited

pytestmark = pytest.mark.timeout(180)
SECRET = "fastload-secret-outside-the-dataset"
ROWS = 6
GIB = 1 << 30


def h5_dataset(root: Path) -> Path:
    """ROWS samples (jpg, cls, txt) in one HDF5 shard written by fastload's own writer."""
    root.mkdir()
    writer = Hdf5ShardWriter(root / "shard-00000.h5", WriterOptions())
    for i in range(ROWS):
        writer.add(PreparedSample(key=f"k{i}", image_field="jpg", image=jpeg_bytes(small_photo(i, size=(24, 24))), label=i % 2,
                                  extra={"txt": f"caption {i}".encode()}))
    info = writer.finish()
    write_index(root, DatasetIndex(layout="hdf5", shards=(info,), fields=("cls", "jpg", "txt"), image_fields=("jpg",)))
    return root


def changed(root: Path, change: Callable[[h5py.File], None], **index_changes: object) -> Path:
    """``root`` with its shard changed in place by ``change`` and the index made to match it (as a
    publisher would): size and checksum, and ``index_changes``."""
    shard = root / "shard-00000.h5"
    with h5py.File(shard, "r+") as f:
        change(f)
    index = read_index(root)
    info = dataclasses.replace(index.shards[0], bytes=shard.stat().st_size, sha256=hashlib.sha256(shard.read_bytes()).hexdigest())
    write_index(root, dataclasses.replace(index, shards=(info,), **index_changes))
    return root


@pytest.fixture()
def outside(tmp_path: Path) -> Path:
    """Files outside the dataset: a secret byte file and an HDF5 file of secret columns."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.bin").write_bytes(SECRET.encode() * 8)
    with h5py.File(folder / "secret.h5", "w") as f:
        f.create_dataset("key", data=np.array([SECRET.encode()] * ROWS, dtype=object), dtype=h5py.string_dtype())
        f.create_dataset("cls", data=np.arange(ROWS, dtype=np.int64))
        f.create_group("extra/txt").create_dataset("bytes", data=np.frombuffer(SECRET.encode(), np.uint8))
    return folder


def external_storage(outside: Path) -> Callable[[h5py.File], None]:
    def change(f: h5py.File) -> None:
        size = f["extra/txt/bytes"].shape[0]
        del f["extra/txt/bytes"]
        f["extra/txt"].create_dataset("bytes", shape=(size,), dtype=np.uint8, external=[(str(outside / "secret.bin"), 0, size)])
    return change


def external_key(outside: Path) -> Callable[[h5py.File], None]:
    def change(f: h5py.File) -> None:
        del f["key"]
        f["key"] = h5py.ExternalLink(str(outside / "secret.h5"), "key")
    return change


def external_group(outside: Path) -> Callable[[h5py.File], None]:
    def change(f: h5py.File) -> None:
        del f["extra"]
        f["extra"] = h5py.ExternalLink(str(outside / "secret.h5"), "extra")
    return change


def soft_link(outside: Path) -> Callable[[h5py.File], None]:
    def change(f: h5py.File) -> None:
        del f["extra/txt"]
        f["extra/txt"] = h5py.SoftLink("/image")  # inside the file, yet no column of a fastload shard is a link
    return change


def virtual_labels(outside: Path) -> Callable[[h5py.File], None]:
    def change(f: h5py.File) -> None:
        del f["cls"]
        layout = h5py.VirtualLayout(shape=(ROWS,), dtype=np.int64)
        layout[:] = h5py.VirtualSource(str(outside / "secret.h5"), "cls", shape=(ROWS,))
        f.create_virtual_dataset("cls", layout)
    return change


ELSEWHERE = {
    "external storage": (external_storage, "column extra/txt/bytes: stored in a file outside the shard"),
    "external link": (external_key, "column key: a external link"),
    "external group": (external_group, "column extra: a external link"),
    "soft link": (soft_link, "column extra/txt: a soft link"),
    "virtual dataset": (virtual_labels, "column cls: a virtual dataset"),
}


@pytest.mark.parametrize("attack", sorted(ELSEWHERE))
def test_columns_stored_elsewhere_refuse_the_shard_by_name(tmp_path: Path, outside: Path, attack: str, capfd: pytest.CaptureFixture) -> None:
    make, message = ELSEWHERE[attack]
    root = changed(h5_dataset(tmp_path / "ds"), make(outside))
    messages = []
    for fields in (None, ["jpg", "cls"], ["txt"]):  # refused whatever is asked for: before any column is read
        for on_error in ("raise", "skip"):
            with pytest.raises(ShardError) as caught:
                list(fastload.DataLoader(root, batch_size=2, transform=T.val(16) if fields != ["txt"] else None, fields=fields,
                                         on_error=on_error, num_workers=0))
            messages.append(str(caught.value))
    assert all(m.startswith(f"{root / 'shard-00000.h5'}: {message}") for m in messages), messages[0]
    problems = fastload.verify_dataset(root, decode=True).problems
    assert len(problems) == 1 and message in problems[0]
    verify = run_cli("verify", str(root), "--decode", check=False)
    assert verify.returncode == 1 and message in verify.stderr
    assert SECRET not in " ".join(messages + problems) + verify.stdout + verify.stderr + "".join(capfd.readouterr())


def hidden_column(rows_span: list[int], chunk: int) -> Callable[[h5py.File], None]:
    """A column ``zzz`` the index does not list: declared 1 GiB of gzip-compressed bytes (none
    written: the file stays small), value i spanning ``rows_span[i]`` bytes, in chunks of ``chunk``."""
    def change(f: h5py.File) -> None:
        group = f.create_group("extra/zzz")
        group.create_dataset("bytes", shape=(GIB,), dtype=np.uint8, chunks=(chunk,), compression="gzip", fillvalue=0)
        group.create_dataset("offsets", data=np.concatenate([[0], np.cumsum(rows_span)]).astype(np.int64))
    return change


LOAD = """
import json
import fastload
from fastload import transforms as T
from fastload.errors import SampleError

def keys(**kwargs):
    try:
        with fastload.DataLoader({root!r}, batch_size=2, num_workers={workers}, return_keys=True, **kwargs) as loader:
            return [k for batch in loader for k in batch[-1]]
    except SampleError as exc:
        return "SampleError: " + str(exc)
"""


def test_a_hidden_compressed_gigabyte_is_never_read_and_refused_when_asked(tmp_path: Path) -> None:
    root = changed(h5_dataset(tmp_path / "ds"), hidden_column([100] * ROWS, GIB))  # one chunk of 1 GiB
    assert root.joinpath("shard-00000.h5").stat().st_size < 100_000
    for workers in (0, 2):
        got = run_limited(LOAD.format(root=str(root), workers=workers) + f"""
ds = fastload.open({str(root)!r})
try:
    ds[0]
    whole = "read"
except SampleError as exc:
    whole = str(exc)
print(json.dumps({{"classic": keys(transform=T.val(16)), "fields": keys(fields=["jpg", "txt", "cls"], transform=T.val(16)),
                  "asked": keys(fields=["zzz"]), "whole": whole}}))
""", memory_bytes=int(1.5 * GIB), timeout=120)
        assert got["classic"] == got["fields"] == [f"k{i}" for i in range(ROWS)]  # never read: not asked for
        for refused in (got["asked"], got["whole"]):
            assert refused.startswith("SampleError: " * (refused is got["asked"]) + f"{root / 'shard-00000.h5'}:k") and \
                f"field zzz: its column declares {GIB} bytes to decompress at once, over {MAX_DECOMPRESSED_BYTES}" in refused, refused
    problems = fastload.verify_dataset(root, decode=True).problems  # each sample named, none aborts the rest
    assert len(problems) == ROWS and all(f"shard-00000.h5:k{i}: field zzz" in p for i, p in enumerate(problems))


def test_one_gigabyte_value_is_a_skippable_sample_error(tmp_path: Path) -> None:
    spans = [100] * ROWS
    spans[3] = GIB - 100 * (ROWS - 1)
    root = changed(h5_dataset(tmp_path / "ds"), hidden_column(spans, 1 << 20))
    got = run_limited(LOAD.format(root=str(root), workers=2) + """
print(json.dumps({"skip": keys(fields=["jpg", "zzz"], transform=T.val(16), on_error="skip"),
                  "raise": keys(fields=["jpg", "zzz"], transform=T.val(16))}))
""", memory_bytes=int(1.5 * GIB), timeout=120)
    assert got["skip"] == ["k0", "k1", "k2", "k4", "k4", "k5"]  # k3 skipped, the next readable one in its place
    assert got["raise"].startswith(f"SampleError: {root / 'shard-00000.h5'}:k3: field zzz: its column declares {spans[3]} bytes")


def decoded_bomb(tmp_path: Path, side: int, chunk_rows: int) -> Path:
    """A decoded-pixels dataset of ROWS rows of ``side`` x ``side`` x 3, gzip chunks of ``chunk_rows``
    rows (none written: the file stays tiny), as its index says."""
    root = h5_dataset(tmp_path / "ds")

    def change(f: h5py.File) -> None:
        del f["image"], f["image_format"]
        f.create_dataset("pixels", shape=(ROWS, side, side, 3), maxshape=(None, side, side, 3), dtype=np.uint8,
                         chunks=(chunk_rows, min(side, 1024), min(side, 1024), 3), compression="gzip", fillvalue=0)

    return changed(root, change, decoded_shape=(side, side, 3), image_fields=(), fields=("cls", "txt"))


def test_decoded_pixels_past_the_pixel_limit_from_a_tiny_shard(tmp_path: Path) -> None:
    root = decoded_bomb(tmp_path, 20000, 1)
    assert root.joinpath("shard-00000.h5").stat().st_size < 20_000
    for workers in (0, 2):
        got = run_limited(LOAD.format(root=str(root), workers=workers) + """
print(json.dumps({"raise": keys(transform=T.val(16)), "skip": keys(transform=T.val(16), on_error="skip"),
                  "text": keys(fields=["txt"]), "untransformed": keys()}))
""", memory_bytes=int(1.5 * GIB), timeout=120)
        assert re.match(rf"SampleError: {re.escape(str(root / 'shard-00000.h5'))}:k\d: decompression bomb: 20000x20000 = 400000000 pixels", got["raise"])
        assert got["skip"].startswith("SampleError: ")  # every sample a bomb: skipped, then named, never a MemoryError
        assert got["text"] == [f"k{i}" for i in range(ROWS)]  # the pixels, not asked for, are not read
        assert got["untransformed"].startswith(f"SampleError: {root}: index.json decoded_shape: decompression bomb")  # no batch slot made


def test_a_pixel_chunk_of_gigabytes_is_a_sample_error(tmp_path: Path) -> None:
    root = decoded_bomb(tmp_path, 256, 1 << 12)  # 4096 rows of 192 KiB in one chunk: 768 MiB declared
    got = run_limited(LOAD.format(root=str(root), workers=0) + """
print(json.dumps({"raise": keys(transform=T.val(16))}))
""", memory_bytes=int(1.5 * GIB), timeout=120)
    assert got["raise"].startswith(f"SampleError: {root / 'shard-00000.h5'}:k0: field pixels: its column declares {(1 << 12) * 256 * 256 * 3} bytes")


def test_fastloads_own_shards_read_as_before(tmp_path: Path) -> None:
    root = h5_dataset(tmp_path / "ds")
    ds = fastload.open(root)
    assert [ds[i]["txt"] for i in range(ROWS)] == [f"caption {i}".encode() for i in range(ROWS)]
    assert ds.raw(2, {"txt"})[1] == {"txt": b"caption 2"} and set(ds.raw(2)[1]) == {"jpg", "cls", "txt"}
    assert fastload.verify_dataset(root, decode=True).ok
    assert json.loads(run_cli("inspect", str(root), "--json").stdout)["samples"] == ROWS
