"""Parquet conversion in bounded memory (#33 item 12): rows are read in batches of about
``BATCH_BYTES``, never a whole row group at once (a 49 KB file once peaked at 1.06 GB to convert
10 rows), and a row group whose read columns declare more than ``MAX_ROW_GROUP_BYTES`` is refused
by name: an error naming the file and group, or with ``--on-error skip`` each of its rows skipped
and reported, the other groups converted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import fastload
from tests.conftest import REPO_ROOT, jpeg_bytes, small_photo
from tests.hostile_data import PEAK_RSS, run_limited

# A conversion's peak resident memory (a conversion with one worker runs in this process) less
# this process's peak before it: ``grown`` in the scripts below (peak_rss: VmHWM, since ru_maxrss
# starts at pytest's own peak and hid every peak below it).

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytestmark = pytest.mark.timeout(180)
ROW_BYTES = 8 << 20
ROWS = 10

# In a fresh process: one row group of ROWS rows of ROW_BYTES zeros each (80 MB declared, a
# few hundred KB compressed), then a row group of four small JPEGs; and those four alone beside it
# (warm-up.parquet: a first conversion imports what every conversion needs before one is measured).
WRITE = """
import sys
from pathlib import Path
import pyarrow as pa, pyarrow.parquet as pq
images = [bytes({row_bytes})] * {rows}
small = [open(p, "rb").read() for p in sys.argv[2:]]
schema = pa.schema([("image", pa.binary()), ("label", pa.int64())])
with pq.ParquetWriter(sys.argv[1], schema, compression="zstd", use_dictionary=False, write_batch_size=1) as writer:  # a page a row
    writer.write_table(pa.table({{"image": images, "label": list(range({rows}))}}, schema=schema), row_group_size={rows})
    del images
    writer.write_table(pa.table({{"image": small, "label": list(range(len(small)))}}, schema=schema))
pq.write_table(pa.table({{"image": small, "label": list(range(len(small)))}}, schema=schema), Path(sys.argv[1]).parent.parent / "warm-up.parquet")
"""
WARM_UP = PEAK_RSS + """
import json
import fastload
from fastload.converters import ConvertOptions, convert
convert({warm_up!r}, {out!r}, ConvertOptions(source="parquet"), quiet=True)
"""


@pytest.fixture(scope="module")
def big_group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("parquet")
    jpegs = []
    for i in range(4):
        jpegs.append(folder / f"{i}.jpg")
        jpegs[-1].write_bytes(jpeg_bytes(small_photo(i)))
    path = folder / "src" / "data.parquet"
    path.parent.mkdir()
    subprocess.run([sys.executable, "-c", WRITE.format(row_bytes=ROW_BYTES, rows=ROWS), str(path), *map(str, jpegs)], check=True, timeout=120)
    assert path.stat().st_size < 1_000_000
    return path


def test_rows_are_read_in_bounded_batches(big_group: Path, tmp_path: Path) -> None:
    got = run_limited(WARM_UP.format(warm_up=str(big_group.parent.parent / "warm-up.parquet"), out=str(tmp_path / "warm")) + f"""
before = peak_rss()
report = convert({str(big_group)!r}, {str(tmp_path / "out")!r}, ConvertOptions(source="parquet", on_error="skip"), quiet=True)
grown = peak_rss() - before
print(json.dumps({{"grown": grown, "samples": report.index.num_samples, "skipped": sum(report.index.skipped.values())}}))
""", memory_bytes=2 << 30)
    assert got["samples"] == 4 and got["skipped"] == ROWS  # the zero rows are no images: each skipped
    assert got["grown"] < 64 << 20, got  # a batch (two rows, their pages) and copies of a row: ~42 MB; the whole group was ~290 MB


def test_a_row_group_declaring_too_much_is_refused_by_name(big_group: Path, tmp_path: Path) -> None:
    """The limit taken down to 64 MiB in the converting process (a group over the real 512 MiB takes
    as much memory to write as it claims): the 80 MB group is refused before any of it is read."""
    got = run_limited(WARM_UP.format(warm_up=str(big_group.parent.parent / "warm-up.parquet"), out=str(tmp_path / "warm")) + f"""
from fastload.converters.sources import parquet
parquet.MAX_ROW_GROUP_BYTES = 64 << 20
try:
    convert({str(big_group)!r}, {str(tmp_path / "raise")!r}, ConvertOptions(source="parquet"), quiet=True)
    failed = None
except fastload.SampleError as exc:
    failed = str(exc)
before = peak_rss()
report = convert({str(big_group)!r}, {str(tmp_path / "skip")!r}, ConvertOptions(source="parquet", on_error="skip"), quiet=True)
grown = peak_rss() - before
print(json.dumps({{"failed": failed, "samples": report.index.num_samples, "grown": grown}}))
""", memory_bytes=2 << 30)
    assert got["failed"].startswith(f"{big_group}#group0/row0: row group 0 declares ")
    assert f"in columns image, label, over the {64 << 20} fastload reads of a group" in got["failed"]
    assert got["samples"] == 4 and got["grown"] < ROW_BYTES  # the other group converted; nothing of the refused one read
    report = [json.loads(line) for line in (tmp_path / "skip" / "skipped.jsonl").read_text().splitlines()]
    assert len(report) == ROWS and all("row group 0 declares" in entry["reason"] for entry in report)
    assert {entry["where"] for entry in report} == {f"{big_group}#group0/row{row}" for row in range(ROWS)}


REPEATED = {  # one 8 MiB value in every row of a 64-row group, in a file of a few KB
    "dictionary": """
images = pa.DictionaryArray.from_arrays(pa.array([0] * 64, pa.int32()), pa.array([bytes(8 << 20)]))
pq.write_table(pa.table({"image": images, "label": list(range(64))}), sys.argv[1], compression="zstd")
""",
    "delta": """
images = pa.array([bytes(8 << 20)] * 64, pa.binary())
pq.write_table(pa.table({"image": images, "label": list(range(64))}), sys.argv[1], compression="zstd", use_dictionary=False,
               column_encoding={"image": "DELTA_BYTE_ARRAY", "label": "PLAIN"})
""",
}


@pytest.mark.parametrize("encoding", REPEATED)
def test_an_image_the_encoding_repeats_is_read_a_row_at_a_time(big_group: Path, tmp_path: Path, encoding: str) -> None:
    """One 8 MiB value in every row of a 64-row group, dictionary- or prefix-encoded (the group
    declaring 8 MiB): rows were batched by the declared size, so the whole group decoded at once
    (64 copies, 512 MiB; 1 GB for round 2's 49 KB file). Now a dictionary leaf is read as one, a
    row's value made when it is asked for; a group sharing prefixes is read a row a batch."""
    path = tmp_path / "src" / "data.parquet"
    path.parent.mkdir()
    subprocess.run([sys.executable, "-c", "import sys\nimport pyarrow as pa, pyarrow.parquet as pq\n" + REPEATED[encoding], str(path)],
                   check=True, timeout=120)
    assert path.stat().st_size < 100_000
    got = run_limited(WARM_UP.format(warm_up=str(big_group.parent.parent / "warm-up.parquet"), out=str(tmp_path / "warm")) + f"""
before = peak_rss()
report = convert({str(path)!r}, {str(tmp_path / "out")!r}, ConvertOptions(source="parquet", on_error="skip", limit=10), quiet=True)
print(json.dumps({{"grown": peak_rss() - before, "skipped": sum(report.index.skipped.values())}}))
""", memory_bytes=2 << 30)
    assert got["skipped"] == 10  # zeros are no image: each row read, and skipped
    assert got["grown"] < 128 << 20, got  # a few copies of a row (dictionary ~40 MB, prefixes ~80 MB); the whole group was 0.6-0.8 GB


def test_a_shuffled_conversion_reads_every_row_right(big_group: Path, tmp_path: Path) -> None:
    """Rows asked for out of order (``--shuffle``): a reader starts its group again, rows stay right."""
    folder = tmp_path / "many"
    folder.mkdir()
    images = [jpeg_bytes(small_photo(i, size=(16, 16))) for i in range(300)]
    pq.write_table(pa.table({"image": images, "label": [i % 7 for i in range(300)]}), folder / "d.parquet", row_group_size=100)
    subprocess.run([sys.executable, "-m", "fastload.cli", "convert", str(folder), str(tmp_path / "out"), "--from", "parquet",
                    "--shuffle", "--workers", "2", "--quiet"], check=True, cwd=REPO_ROOT, timeout=120)
    ds = fastload.open(tmp_path / "out")
    assert len(ds) == 300
    for i in range(len(ds)):
        key, fields, _ = ds.raw(i)
        _, group, row = key.rsplit("_", 2)
        n = 100 * int(group) + int(row)
        assert fields["jpg"] == images[n] and int(fields["cls"]) == n % 7
