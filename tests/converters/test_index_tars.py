"""``fastload index`` over worker processes writes exactly what one process writes (index.json, each
tar's .idx and sample table, byte for byte), and a damaged tar is named whichever process read it:
the header checksums, checked all at once, still name the first damaged header before whatever
else its damage breaks."""

from __future__ import annotations

import io
import re
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

import fastload
from fastload.converters import ConvertOptions, convert
from fastload.converters.index_tars import index_tars
from tests.conftest import cli_env, jpeg_bytes, run_cli, small_photo, tree_bytes

EXE = str(Path(sys.executable).with_name("fastload"))

TARS = 7


@pytest.fixture(scope="module")
def tars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TARS tars of 1 to 7 samples (jpg, cls, and txt on some), written by tarfile, not indexed."""
    root = tmp_path_factory.mktemp("tars")
    number = 0
    for t in range(TARS):
        with tarfile.open(root / f"shard-{t:03d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for _ in range(1 + t):
                fields = {"jpg": jpeg_bytes(small_photo(number, label=number % 3)), "cls": str(number % 3).encode()}
                if number % 2:
                    fields["txt"] = f"caption {number}".encode()
                for ext, data in fields.items():
                    info = tarfile.TarInfo(f"s{number:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                number += 1
    return root


def copy_of(tars: Path, root: Path) -> Path:
    shutil.copytree(tars, root)
    return root


def test_worker_processes_write_what_one_process_writes(tars: Path, tmp_path: Path) -> None:
    serial = copy_of(tars, tmp_path / "serial")
    index, _ = index_tars(serial, workers=1)
    assert index.num_samples == sum(range(1, TARS + 1)) and len(index.shards) == TARS
    written = tree_bytes(serial)
    assert {name for name in written if not name.endswith(".tar")} == {
        "index.json", *(f"shard-{t:03d}{suffix}" for t in range(TARS) for suffix in (".idx", ".table"))}
    for workers in (2, 3, TARS + 5):
        parallel = copy_of(tars, tmp_path / f"workers-{workers}")
        index_tars(parallel, workers=workers)
        assert tree_bytes(parallel) == written
    by_cli = copy_of(tars, tmp_path / "cli")
    run_cli("index", str(by_cli), "--workers", "2")
    assert tree_bytes(by_cli) == written
    ds = fastload.open(by_cli)
    assert [ds[i]["key"] for i in range(len(ds))] == [f"s{n:05d}" for n in range(len(ds))]
    assert run_cli("verify", str(by_cli)).returncode == 0


def header_at(path: Path, member: int) -> int:
    """The byte offset of member ``member``'s header."""
    with tarfile.open(path) as tar:
        return tar.getmembers()[member].offset


@pytest.mark.parametrize("damage", ["name", "size"])
def test_a_damaged_tar_is_named_by_its_path_and_header(tars: Path, tmp_path: Path, damage: str) -> None:
    root = copy_of(tars, tmp_path / "damaged")
    bad = root / "shard-004.tar"
    data = bytearray(bad.read_bytes())
    at = header_at(bad, 3)
    if damage == "name":
        data[at] ^= 0x20  # one letter of its name: only the checksum tells
    else:
        data[at + 124 : at + 136] = b"77777777777\0"  # a size past the end: the checksum is still what fails first
    bad.write_bytes(bytes(data))
    for workers in (1, 3):
        with pytest.raises(ValueError, match=rf"shard-004\.tar: not a readable tar \(bad header checksum at byte {at}\)"):
            index_tars(root, workers=workers)
    assert not (root / "index.json").exists()
    proc = run_cli("index", str(root), "--workers", "2", check=False)
    assert proc.returncode != 0 and f"shard-004.tar: not a readable tar (bad header checksum at byte {at})" in proc.stderr


def test_a_truncated_tar_is_named_whichever_worker_reads_it(tars: Path, tmp_path: Path) -> None:
    root = copy_of(tars, tmp_path / "truncated")
    bad = root / "shard-006.tar"
    cut = header_at(bad, 5) + 512 + 10  # inside member 5's data
    bad.write_bytes(bad.read_bytes()[:cut])
    with pytest.raises(ValueError, match=r"shard-006\.tar: not a readable tar \(member 5 runs past the end of the file\)"):
        index_tars(root, workers=2)
    with pytest.raises(ValueError, match="workers must be at least 1"):
        index_tars(root, workers=-1)


def test_a_tar_cut_at_a_block_boundary_is_refused(tars: Path, tmp_path: Path) -> None:
    """A copy cut short between members (a 512-byte boundary: an interrupted copy or download
    often ends on one) has no end-of-archive block: refused by name, never indexed with its last
    samples short of a field."""
    root = copy_of(tars, tmp_path / "cut")
    bad = root / "shard-002.tar"
    bad.write_bytes(bad.read_bytes()[: header_at(bad, 5)])  # members 0-4 whole, nothing after
    with pytest.raises(ValueError, match=r"shard-002\.tar: not a readable tar \(no end-of-archive block after member 5: cut short\?\)"):
        index_tars(root, workers=2)
    assert not (root / "index.json").exists()


def test_a_hard_linked_member_reads_as_the_file_it_links_to(tmp_path: Path) -> None:
    """GNU tar stores a second link to a file as a hard-link member (type 1, no data): it is the
    sample's field all the same, with the linked file's bytes (short and GNU long link names), to
    `fastload index` and to `convert --from wds` alike."""
    long_dir = "d" * 120  # past the 100 bytes of a header's name and link fields: GNU L and K records
    photo, other = jpeg_bytes(small_photo(1)), jpeg_bytes(small_photo(2))
    root = tmp_path / "linked"
    root.mkdir()
    with tarfile.open(root / "a.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        def add(name: str, data: bytes | None = None, link: str | None = None) -> None:
            info = tarfile.TarInfo(name)
            if link is None:
                info.size = len(data or b"")
                tar.addfile(info, io.BytesIO(data or b""))
            else:
                info.type, info.linkname = tarfile.LNKTYPE, link
                tar.addfile(info)
        add("s0.jpg", photo)
        add("s0.cls", b"0")
        add("s1.jpg", link="s0.jpg")
        add("s1.cls", b"1")
        add(f"{long_dir}/s2.jpg", other)
        add(f"{long_dir}/s2.cls", b"2")
        add(f"{long_dir}/s3.jpg", link=f"{long_dir}/s2.jpg")
        add(f"{long_dir}/s3.cls", b"3")
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(root / "a.tar", source / "a.tar")
    index_tars(root, workers=1)
    convert(str(source), str(tmp_path / "converted"), ConvertOptions(source="wds", samples_per_shard=10))  # convert --from wds too
    expected = [
        ("s0", {"jpg": photo, "cls": b"0"}), ("s1", {"jpg": photo, "cls": b"1"}),
        (f"{long_dir}/s2", {"jpg": other, "cls": b"2"}), (f"{long_dir}/s3", {"jpg": other, "cls": b"3"}),
    ]
    for folder in (root, tmp_path / "converted"):
        ds = fastload.open(folder)
        assert [(ds.raw(i)[0], ds.raw(i)[1]) for i in range(len(ds))] == expected
        assert run_cli("verify", str(folder)).returncode == 0


def full_disk(limit: int) -> Callable[[], None]:
    """A preexec_fn: files may grow to ``limit`` bytes; past it a write fails with EFBIG (SIGXFSZ
    ignored), as a full disk's writes fail with ENOSPC."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


# fastload index in a process that SIGKILLs itself when it is about to rename shard-003's table
# into place: its temporary written, its lock held, nothing cleaned up.
KILLED_MID_WRITE = """
import os, signal, sys
rename = os.replace
def rename_or_die(source, target, *args, **kwargs):
    if str(target).endswith("shard-003.table"):
        os.kill(os.getpid(), signal.SIGKILL)
    return rename(source, target, *args, **kwargs)
os.replace = rename_or_die
from fastload.converters.index_tars import index_tars
index_tars(sys.argv[1], workers=1)
"""


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize(("how", "workers"), [("disk full", "1"), ("disk full", "2"), ("killed", "1")])
def test_a_failed_or_killed_index_leaves_nothing_after_a_rerun(tars: Path, tmp_path: Path, how: str, workers: str) -> None:
    root = copy_of(tars, tmp_path / "tars")
    if how == "killed":
        first = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(root)], capture_output=True, text=True, env=cli_env(), timeout=120)
        assert first.returncode == -signal.SIGKILL, first.stderr
        assert [name for name in leftovers(root) if ".tmp-" in name], leftovers(root)  # what a killed run leaves
    else:
        first = subprocess.run([EXE, "index", str(root), "--workers", workers], capture_output=True, text=True, env=cli_env(),
                               preexec_fn=full_disk(400), timeout=120)
        lines = first.stderr.strip().splitlines()
        assert first.returncode == 2 and len(lines) == 1 and "File too large" in lines[0], first.stderr
        assert re.search(rf"'{re.escape(str(root))}/shard-00\d\.(idx|table)'", lines[0]), lines[0]  # the file it could not write
        assert not [name for name in leftovers(root) if ".tmp-" in name]  # the failed write's temporary is gone
    run_cli("index", str(root), "--workers", workers, "--force")
    assert leftovers(root) == []  # no temporary and no lock survives the successful rerun
    clean = copy_of(tars, tmp_path / "clean")
    index_tars(clean, workers=1)
    assert tree_bytes(root) == tree_bytes(clean)
