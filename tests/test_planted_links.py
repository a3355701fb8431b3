"""Writes never follow a link planted in a dataset folder (#33): every file fastload writes there
goes through a new temporary created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` under a name nobody can
guess, and a lock file is never opened through a link. Each operation that writes into a folder
runs in a fresh process that first plants, for its own PID, a symlink to a file outside at every
temporary name the writers once used (``.NAME.tmp-PID``, ``.NAME.tmp-HOST-PID``) beside every file
it will write; the file outside must come out untouched and every link unfollowed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fastload._util.files import atomic_write_bytes, open_lock_file, temporary_beside
from fastload.converters.lock import LOCK_FILE
from tests.conftest import REPO_ROOT, drop_tables, jpeg_bytes, run_cli, small_photo

VICTIM_TEXT = b"a file outside the dataset\n"

# Run in a fresh process: plant the links for this process's PID, then do the operation.
PLANT_THEN_RUN = """
import json, os, socket, sys
from pathlib import Path

root, victim, names, operation = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
for name in names:
    for tail in (str(os.getpid()), f"{socket.gethostname()}-{os.getpid()}"):
        os.symlink(victim, root / f".{name}.tmp-{tail}")
if operation == "open":
    import fastload
    ds = fastload.open(root)
    for i in range(len(ds)):
        ds.raw(i)
elif operation == "index":
    from fastload.converters.index_tars import index_tars
    index_tars(root, workers=1)
"""


def run_with_planted_links(root: Path, victim: Path, names: list[str], operation: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PLANT_THEN_RUN, str(root), str(victim), json.dumps(names), operation],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def planted_links(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if p.is_symlink()]


@pytest.fixture()
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "victim.txt"
    path.parent.mkdir()
    path.write_bytes(VICTIM_TEXT)
    return path


def test_building_missing_sample_tables_never_writes_through_a_link(clean: Path, tmp_path: Path, victim: Path) -> None:
    root = drop_tables(shutil.copytree(clean, tmp_path / "ds"))
    tables = [p.with_suffix(".table").name for p in sorted(root.glob("*.tar"))]
    run_with_planted_links(root, victim, tables, "open")
    assert victim.read_bytes() == VICTIM_TEXT
    assert all((root / name).is_file() and not (root / name).is_symlink() for name in tables)  # built, beside the links
    assert len(planted_links(root)) == 2 * len(tables)  # each link still there, none replaced or followed


def test_fastload_index_never_writes_through_a_link(tmp_path: Path, victim: Path) -> None:
    root = tmp_path / "tars"
    root.mkdir()
    for t in range(3):
        with tarfile.open(root / f"part-{t}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(2):
                path = tmp_path / f"s{t}{i}.jpg"
                path.write_bytes(jpeg_bytes(small_photo(t * 2 + i)))
                tar.add(path, arcname=f"s{t}{i}.jpg")
    outputs = [name for t in range(3) for name in (f"part-{t}.idx", f"part-{t}.table")] + ["index.json"]
    run_with_planted_links(root, victim, outputs, "index")
    assert victim.read_bytes() == VICTIM_TEXT
    assert all((root / name).is_file() and not (root / name).is_symlink() for name in outputs)
    assert planted_links(root) == []  # taken for a killed run's temporaries: removed (the links, not what they name)


def test_convert_refuses_a_lock_file_that_is_a_link(image_folder: Path, tmp_path: Path, victim: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).symlink_to(victim)
    proc = run_cli("convert", str(image_folder), str(out), "--from", "imagefolder", check=False)
    assert proc.returncode == 2 and victim.read_bytes() == VICTIM_TEXT
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and LOCK_FILE in lines[0] and "lock file" in lines[0], proc.stderr
    (out / LOCK_FILE).unlink()
    run_cli("convert", str(image_folder), str(out), "--from", "imagefolder")  # the link gone, it converts
    assert not (out / LOCK_FILE).exists()


@pytest.mark.parametrize("planted", ["symlink", "hard link", "fifo"])
def test_a_lock_file_is_only_ever_a_plain_file_of_its_own(tmp_path: Path, victim: Path, planted: str) -> None:
    lock = tmp_path / "ds" / LOCK_FILE
    lock.parent.mkdir()
    if planted == "symlink":
        lock.symlink_to(victim)
    elif planted == "hard link":
        os.link(victim, lock)
    else:
        os.mkfifo(lock)
    with pytest.raises(OSError, match="cannot use it as a lock file") as caught:
        open_lock_file(lock)
    assert caught.value.filename == str(lock)
    assert victim.read_bytes() == VICTIM_TEXT


def test_temporaries_are_new_files_under_fresh_names(tmp_path: Path, victim: Path) -> None:
    """The property behind the rest: whatever a folder already holds, a temporary is a new regular
    file (never an existing name, never through a link), and a failed atomic write leaves none."""
    target = tmp_path / "index.json"
    for i in range(50):  # links at many names a writer might pick
        (tmp_path / f".index.json.tmp-{i}").symlink_to(victim)
    names = set()
    for _ in range(200):
        fd, path = temporary_beside(target)
        os.close(fd)
        assert path.parent == tmp_path and path.name.startswith(".index.json.tmp-") and not path.is_symlink()
        names.add(path.name)
        path.unlink()
    assert len(names) == 200 and victim.read_bytes() == VICTIM_TEXT
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(TypeError):
        atomic_write_bytes(target, "not bytes")  # type: ignore[arg-type]  # the write fails part-way
    assert sorted(p.name for p in tmp_path.iterdir()) == before
