"""``fastload verify`` catches every flipped byte and truncation; the CLI works end to end."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from fastload import verify_dataset
from fastload._util.files import file_sha256
from tests.conftest import run_cli


@pytest.fixture()
def converted(image_folder: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    run_cli("convert", str(image_folder), str(out), "--from", "imagefolder", "--samples-per-shard", "10", "--quiet")
    return out


def test_verify_ok(converted: Path) -> None:
    result = run_cli("verify", str(converted), "--decode")
    assert "3 shards, 30 samples verified and decoded: OK" in result.stdout


@pytest.mark.parametrize("seed", range(5))
def test_flipped_byte_is_caught(converted: Path, seed: int) -> None:
    rng = random.Random(seed)
    shard = converted / f"shard-{rng.randrange(3):05d}.tar"
    data = bytearray(shard.read_bytes())
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    shard.write_bytes(bytes(data))
    result = run_cli("verify", str(converted), check=False)
    assert result.returncode == 1
    assert f"BAD {shard.name}: sha256 mismatch" in result.stderr


def test_truncated_and_missing_shards_are_caught(converted: Path) -> None:
    shard = converted / "shard-00001.tar"
    shard.write_bytes(shard.read_bytes()[:-700])
    (converted / "shard-00002.tar").unlink()
    result = run_cli("verify", str(converted), check=False)
    assert result.returncode == 1
    assert "BAD shard-00001.tar: " in result.stderr and "truncated" in result.stderr
    assert "BAD shard-00002.tar: missing" in result.stderr


@pytest.mark.parametrize("change", ["trailing space", "missing"])
def test_a_changed_offset_index_is_caught_by_its_checksum(converted: Path, change: str) -> None:
    """A .idx that still parses and matches its tar (a trailing space) but is not the one indexed,
    or none at all."""
    idx = converted / "shard-00001.idx"
    if change == "missing":
        idx.unlink()
    else:
        idx.write_bytes(idx.read_bytes() + b" ")
    result = run_cli("verify", str(converted), check=False)
    assert result.returncode == 1
    assert result.stderr.splitlines() == ["BAD shard-00001.idx: missing or sha256 mismatch (the shard's offset index is corrupted)"]


def test_decode_names_each_sample_whose_image_does_not_decode(corrupt: tuple[Path, set[str]]) -> None:
    """Checksums cannot see a shard corrupted before it was indexed; --decode does, per key."""
    root, bad_keys = corrupt
    assert not verify_dataset(root).ok  # the checksum of shard 1 no longer matches
    index_path = root / "index.json"
    data = json.loads(index_path.read_text())
    data["shards"][1]["sha256"] = file_sha256(root / data["shards"][1]["path"])  # as if written so
    index_path.write_text(json.dumps(data))
    assert verify_dataset(root).ok
    problems = verify_dataset(root, decode=True).problems
    assert len(problems) == 2 and {p.split(":")[1] for p in problems} == bad_keys


def test_hdf5_flipped_byte_is_caught(image_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "h5"
    run_cli("convert", str(image_folder), str(out), "--from", "imagefolder", "--to", "hdf5", "--quiet")
    assert "OK" in run_cli("verify", str(out), "--decode").stdout
    shard = out / "shard-00000.h5"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10  # inside the image bytes: HDF5's structure is intact
    shard.write_bytes(bytes(data))
    result = run_cli("verify", str(out), check=False)
    assert result.returncode == 1
    assert result.stderr.splitlines() == ["BAD shard-00000.h5: sha256 mismatch (corrupted)"]
    assert "FAILED (1 problems)" in result.stdout


def test_cli_convert_inspect_and_errors(image_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_cli("convert", str(image_folder), str(out), "--from", "imagefolder", "--shard-size", "64KB", "--limit", "12")
    assert "12 samples in" in result.stdout
    summary = json.loads(run_cli("inspect", str(out), "--json").stdout)
    assert summary["samples"] == 12 and summary["layout"] == "wds" and summary["fields"] == ["cls", "jpg"]
    assert sum(summary["class_counts"].values()) == 12
    missing = run_cli("convert", str(tmp_path / "nope"), str(tmp_path / "o"), "--from", "imagefolder", check=False)
    assert missing.returncode == 2 and "nope: not a directory" in missing.stderr
    not_dataset = run_cli("inspect", str(tmp_path), check=False)
    assert not_dataset.returncode == 2 and "no index.json" in not_dataset.stderr


def test_parse_size() -> None:
    from fastload.converters import parse_size

    assert parse_size("256MB") == 256_000_000
    assert parse_size("1GiB") == 1 << 30
    assert parse_size("64KiB") == 65536
    assert parse_size("1.5G") == 1_500_000_000
    assert parse_size("1000") == 1000
    with pytest.raises(ValueError, match="cannot parse size"):
        parse_size("lots")
