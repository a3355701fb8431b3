"""The one parser of tars fastload did not write (``fastload.formats.tar_headers``), behind
``fastload index``, ``convert --from wds`` and ``verify``: it lists exactly what Python's tarfile
lists on every valid tar (seeded random tars: ustar, GNU and pax, long and non-ASCII names,
directories, symlinks, hard links); it checks every length before using it (crafted pax records and
sizes: a zero-length record, CVE-2019-20907's pattern, and a negative size, CVE-2025-8194's, loop
for ever in tarfile); a damaged tar is named, never read in silence up to the damage; and no path
reads a foreign tar through tarfile."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import random
import re
import resource
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fastload.converters.index_tars import index_tars
from fastload.formats.index import read_index, write_index
from fastload.formats.tar_headers import MAX_EXTENDED_HEADER, TarDamage, tar_members
from tests.conftest import REPO_ROOT, cli_env, jpeg_bytes, run_cli, small_photo
from tests.hostile_data import pax_member, tar_header, tar_member, tar_of

pytestmark = pytest.mark.timeout(300)
JPG = jpeg_bytes(small_photo(0, size=(16, 16)))


def sample(key: str) -> bytes:
    return tar_member(f"{key}.jpg", JPG) + tar_member(f"{key}.cls", b"1")


def pax_record(key: str, value: str) -> bytes:
    """One well-formed pax record, its length counting itself."""
    body = f" {key}={value}\n".encode()
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return str(length).encode() + body


# Each a tar of samples s0 and s1, a crafted part, then s2: every length is checked before use.
CRAFTED = {
    "zero-length pax record": pax_member(b"0 path=s2.jpg\n") + sample("s2"),
    "negative pax size": pax_member(b"15 size=-51200\n") + sample("s2"),
    "pax size with a sign": pax_member(b"13 size=+512\n") + sample("s2"),
    "pax size with underscores": pax_member(b"13 size=5_12\n") + sample("s2"),
    "pax record past its header": pax_member(b"99 path=s2.jpg\n") + sample("s2"),
    "pax record shorter than its prefix": pax_member(b"3 path=s2.jpg\n") + sample("s2"),
    "pax length with spaces": pax_member(b" 15 path=s2.jpg\n") + sample("s2"),
    "pax record without a newline": pax_member(b"14 path=s2.jpgX") + sample("s2"),
    "oversized pax header": pax_member(pax_record("comment", "a" * MAX_EXTENDED_HEADER)) + sample("s2"),
    "negative octal size": tar_header("s2.jpg", 0, size_field=b"-0000001000\0") + JPG + bytes(-len(JPG) % 512),
    "negative base-256 size": tar_header("s2.jpg", 0, size_field=b"\xff" * 12) + JPG + bytes(-len(JPG) % 512),
    "size with a plus sign": tar_header("s2.jpg", 0, size_field=b"+0000001000\0") + JPG + bytes(-len(JPG) % 512),
    "size with a digit 9": tar_header("s2.jpg", 0, size_field=b"99999999999\0") + JPG + bytes(-len(JPG) % 512),
}

# In a fresh process capped at 2 GiB: index, convert (raising, then skipping) and verify the
# crafted tar; each outcome as JSON. A loop or a runaway allocation fails it (timeout, the cap).
EVERY_READER = """
import json, sys
from pathlib import Path
import fastload
from fastload.converters import ConvertOptions, convert
from fastload.converters.index_tars import index_tars

tar, work, verify_root = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
out = {}
try:
    index_tars(tar.parent, workers=1)
    out["index"] = "indexed"
except ValueError as exc:
    out["index"] = str(exc)
try:
    convert(str(tar), str(work / "raise"), ConvertOptions(source="wds"), quiet=True)
    out["convert"] = "converted"
except fastload.SampleError as exc:
    out["convert"] = str(exc)
report = convert(str(tar), str(work / "skip"), ConvertOptions(source="wds", on_error="skip"), quiet=True)
ds = fastload.open(work / "skip")
out["kept"] = [ds[i]["key"] for i in range(len(ds))]
out["skipped"] = (work / "skip" / "skipped.jsonl").read_text().splitlines()
out["verify"] = fastload.verify_dataset(verify_root).problems
print(json.dumps(out))
"""


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def dataset_over(tar: Path, crafted: bytes, root: Path) -> Path:
    """A dataset whose one shard is ``tar`` as first written, then replaced by ``crafted`` with the
    index's size and checksum made to match (as a publisher could): only its headers are wrong."""
    root.mkdir()
    shutil.copy(tar, root / "part.tar")
    index_tars(root, workers=1)
    (root / "part.tar").write_bytes(crafted)
    index = read_index(root)
    shard = dataclasses.replace(index.shards[0], bytes=len(crafted), sha256=hashlib.sha256(crafted).hexdigest())
    write_index(root, dataclasses.replace(index, shards=(shard,)))
    return root


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_lengths_are_refused_by_every_reader_naming_the_tar(tmp_path: Path, case: str) -> None:
    crafted = tar_of(sample("s0"), sample("s1"), CRAFTED[case])
    tar = tmp_path / "src" / "part.tar"
    tar.parent.mkdir()
    tar.write_bytes(crafted)
    verify_root = dataset_over(_clean(tmp_path), crafted, tmp_path / "verified")
    proc = subprocess.run(
        [sys.executable, "-c", EVERY_READER, str(tar), str(tmp_path / "work"), str(verify_root)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, preexec_fn=limit_memory,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["index"].startswith(f"{tar}: not a readable tar ("), got["index"]
    assert got["convert"].startswith(f"{tar}:"), got["convert"]
    assert got["kept"] == ["s0"]  # s1, the last before the damage, may have lost members: refused, reported
    skipped = [json.loads(line) for line in got["skipped"]]
    assert [entry["key"] for entry in skipped] == ["s1", f"part.tar@{len(sample('s0')) + len(sample('s1'))}"]
    assert all(entry["where"].startswith(str(tar)) for entry in skipped)
    assert len(got["verify"]) == 1 and got["verify"][0].startswith("part.tar: ") and "not a readable tar (" in got["verify"][0]
    assert "9999" not in proc.stdout and "size=" not in proc.stdout  # the messages never repeat what the tar holds


def _clean(tmp_path: Path) -> Path:
    """The crafted tar's clean twin: the same two samples first, then s2 as it should be."""
    path = tmp_path / "clean.tar"
    path.write_bytes(tar_of(sample("s0"), sample("s1"), sample("s2")))
    return path


# --- the parser lists what tarfile lists, on every valid tar -------------------------------------


def random_tar(rng: random.Random) -> bytes:
    """A valid tar written by tarfile (trusted here): a format, then up to 12 members of random kinds,
    names (long, nested, non-ASCII) and sizes."""
    fmt = rng.choice([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
    buf = io.BytesIO()
    files: list[str] = []
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for i in range(rng.randint(0, 12)):
            parts = [rng.choice(["a", "dir", "x" * rng.randint(1, 120), "é", "s p"]) for _ in range(rng.randint(1, 3))]
            name = "/".join(parts) + f"{i}.{rng.choice(['jpg', 'cls', 'txt', 'seg.png'])}"
            kind = rng.choice(["file"] * 6 + ["dir", "symlink", "hardlink"])
            info = tarfile.TarInfo(name)
            data = b""
            if kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, "elsewhere"
            elif kind == "hardlink" and files:
                info.type, info.linkname = tarfile.LNKTYPE, rng.choice(files)
            else:
                data = rng.randbytes(rng.choice([0, 1, 511, 512, 513, rng.randint(0, 3000)]))
                info.size = len(data)
            if fmt == tarfile.PAX_FORMAT and rng.random() < 0.3:
                info.pax_headers = {"comment": "x" * rng.randint(0, 300)}
            try:
                tar.addfile(info, io.BytesIO(data))
            except ValueError:
                continue  # a name ustar cannot hold
            if info.isreg():
                files.append(name)
    return buf.getvalue()


def tarfile_listing(data: bytes) -> list[tuple[str, int, int]]:
    """(name, data offset, size) of every regular file and hard link (as the file it names), by tarfile."""
    out: list[tuple[str, int, int]] = []
    regular: dict[str, tarfile.TarInfo] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            if member.isreg():
                regular[member.name] = member
                out.append((member.name, member.offset_data, member.size))
            elif member.islnk():
                target = regular[member.linkname]
                out.append((member.name, target.offset_data, target.size))
    return out


def test_the_parser_lists_what_tarfile_lists_on_valid_tars() -> None:
    rng = random.Random(33)
    for case in range(300):
        data = random_tar(rng)
        got = [(name, offset, size) for _, name, offset, size in tar_members(memoryview(data), "t.tar")]
        assert got == tarfile_listing(data), f"case {case}"


# --- a damaged source tar is an error naming it, or counted and reported: never silent ------------


def ten_sample_tar() -> tuple[bytes, list[int]]:
    """Ten samples (jpg, cls), each member with its own pax header (a comment); and where each
    sample's first pax header starts."""
    buf = io.BytesIO()
    starts = []
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(10):
            starts.append(buf.tell())
            for ext, data in (("jpg", jpeg_bytes(small_photo(i, size=(16, 16)))), ("cls", str(i % 3).encode())):
                info = tarfile.TarInfo(f"s{i}.{ext}")
                info.size, info.pax_headers = len(data), {"comment": f"sample {i}"}
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), starts


def damaged(kind: str) -> bytes:
    """The ten-sample tar damaged at sample 3: a flipped header byte, a zero-length pax record, its
    first header zeroed (an end-of-archive block with members after it), or cut there."""
    data, starts = ten_sample_tar()
    raw = bytearray(data)
    at = starts[3]
    if kind == "flipped header byte":
        raw[at + 5] ^= 0x01  # a byte of sample 3's pax header's name: only the checksum tells
    elif kind == "zero-length pax record":
        record = raw.index(b" comment=sample 3\n", at)
        digits = raw.rindex(b"\n", at + 512, record) + 1 if b"\n" in raw[at + 512 : record] else at + 512
        raw[digits:record] = b"0" * (record - digits)
    elif kind == "zeroed header":
        raw[at : at + 512] = bytes(512)
    else:
        del raw[at:]
    return bytes(raw)


@pytest.mark.parametrize("kind", ["flipped header byte", "zero-length pax record", "zeroed header", "cut between members"])
def test_convert_from_a_damaged_tar_names_it_or_reports_the_loss(tmp_path: Path, kind: str) -> None:
    tar = tmp_path / "src.tar"
    tar.write_bytes(damaged(kind))
    failed = run_cli("convert", str(tar), str(tmp_path / "raise"), "--from", "wds", "--quiet", check=False)
    lines = failed.stderr.strip().splitlines()
    assert failed.returncode == 2 and len(lines) == 1 and str(tar) in lines[0] and "damaged" in lines[0], failed.stderr
    skipping = run_cli("convert", str(tar), str(tmp_path / "skip"), "--from", "wds", "--on-error", "skip", "--quiet")
    assert re.search(r": 2 samples in 1 wds shard,", skipping.stdout) and "skipped 2 bad samples" in skipping.stdout, skipping.stdout
    report = [json.loads(line) for line in (tmp_path / "skip" / "skipped.jsonl").read_text().splitlines()]
    assert [entry["key"] for entry in report] == ["s2", f"src.tar@{ten_sample_tar()[1][3]}"]
    assert "their number unknown" in report[1]["reason"] and report[1]["where"] == str(tar)


def test_no_foreign_tar_is_read_through_tarfile(tmp_path: Path) -> None:
    """``fastload index``, ``convert --from wds`` and ``verify`` with tarfile's readers made to fail."""
    data, _ = ten_sample_tar()
    (tmp_path / "tars").mkdir()
    (tmp_path / "tars" / "a.tar").write_bytes(data)
    script = f"""
import tarfile
def refuse(*args, **kwargs):
    raise AssertionError("a tar read through tarfile")
tarfile.open = tarfile.TarFile.open = tarfile.TarFile.__init__ = refuse
import fastload
from fastload.converters import ConvertOptions, convert
from fastload.converters.index_tars import index_tars
index_tars({str(tmp_path / "tars")!r}, workers=1)
convert({str(tmp_path / "tars" / "a.tar")!r}, {str(tmp_path / "out")!r}, ConvertOptions(source="wds"), quiet=True)
assert fastload.verify_dataset({str(tmp_path / "tars")!r}, decode=True).ok
assert len(fastload.open({str(tmp_path / "out")!r})) == 10
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=cli_env())
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_tar_damage_keeps_the_members_before_it() -> None:
    data, starts = ten_sample_tar()
    raw = bytearray(data)
    raw[starts[6] + 5] ^= 0x01
    with pytest.raises(TarDamage) as caught:
        tar_members(memoryview(bytes(raw)), "t.tar")
    assert caught.value.at == starts[6] and [name for _, name, _, _ in caught.value.members] == [f"s{i}.{e}" for i in range(6) for e in ("jpg", "cls")]
    assert str(caught.value) == f"t.tar: not a readable tar (bad header checksum at byte {starts[6]})"


def test_an_archive_ends_at_two_zero_blocks_or_a_last_one_and_a_lone_one_is_damage() -> None:
    """As GNU tar reads them: what follows two zero blocks is not the archive's; one zero block at
    the end of the file ends it too; one with a header after it is a zeroed header, not the end."""
    members = sample("a") + sample("b")
    assert len(tar_members(memoryview(tar_of(members) + b"junk" * 128), "t.tar")) == 4
    assert len(tar_members(memoryview(members + bytes(512)), "t.tar")) == 4
    with pytest.raises(TarDamage, match=re.escape(f"t.tar: not a readable tar (a lone zero block at byte {len(sample('a'))}, a header after it")):
        tar_members(memoryview(tar_of(sample("a"), bytes(512), sample("b"))), "t.tar")
