"""Conversions under hostile conditions: the main process SIGKILLed (its workers go too and free
the caller's stdout), two runs into one OUT (the second fails at once naming the first), a source
changed between a kill and the rerun (its shards are redone), a full disk and a tar member with a
bogus GNU base-256 size (one line, exit status 2, no traceback, resumable)."""

from __future__ import annotations

import io
import os
import re
import resource
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image

from fastload.converters import ConvertOptions, convert
from fastload.converters.lock import LOCK_FILE
from tests.conftest import alive, cli_env, jpeg_bytes, photo_folder, run_cli, small_photo, tree_bytes

EXE = str(Path(sys.executable).with_name("fastload"))


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 small JPEGs in 3 class folders."""
    return photo_folder(tmp_path_factory.mktemp("photos"), 120)


def convert_args(src: Path, out: Path, workers: int = 2, per_shard: int = 2) -> list[str]:
    return ["convert", str(src), str(out), "--from", "imagefolder", "--samples-per-shard", str(per_shard), "--workers", str(workers), "--quiet"]


def start(args: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([EXE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(), **kwargs)


def wait_for_results(proc: subprocess.Popen, out: Path, count: int, timeout: float = 60) -> None:
    """Until ``count`` shard result files exist in OUT's bookkeeping (or the run ends)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if len(list((out / ".fastload-partial").glob("shard-*.json"))) >= count:
            return
        time.sleep(0.005)


def test_sigkill_of_convert_takes_its_workers_along(photos: Path, tmp_path: Path) -> None:
    """Only the main process is killed (as the OOM killer would): the workers it forked die
    with it, so the caller's communicate() returns at once instead of waiting on their stdout."""
    out = tmp_path / "out"
    proc = start(convert_args(photos, out, workers=2, per_shard=1))
    wait_for_results(proc, out, 2)
    workers = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    assert proc.poll() is None and len(workers) == 2, "the conversion ended before it could be killed: make it longer"
    proc.send_signal(signal.SIGKILL)
    begin = time.monotonic()
    try:
        proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        for pid in alive(workers):
            os.kill(pid, signal.SIGKILL)
        raise
    assert time.monotonic() - begin < 5
    deadline = time.monotonic() + 5
    while alive(workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = alive(workers)
    for pid in survivors:  # never leave orphans behind, even when failing
        os.kill(pid, signal.SIGKILL)
    assert survivors == []


RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


@pytest.mark.slow
def test_sigkill_of_a_ray_convert_takes_its_workers_along(photos: Path, tmp_path: Path) -> None:
    """With the local Ray it starts: no Ray process holds the caller's stdout, and the raylet,
    GCS and task workers exit within seconds. (Ray's two node agents are left to exit by
    themselves: they first try to report to the dead GCS, which took ~1-2 minutes here.)"""
    pytest.importorskip("ray")
    out = tmp_path / "out"
    proc = start([*convert_args(photos, out, workers=2, per_shard=1), "--engine", "ray"])
    wait_for_results(proc, out, 3, timeout=120)
    names = {p.pid: p.name() for p in psutil.Process(proc.pid).children(recursive=True)}
    workers = [pid for pid, name in names.items() if name not in RAY_AGENTS]
    assert proc.poll() is None and len(workers) >= 4, names  # raylet, GCS, task workers, ...
    proc.send_signal(signal.SIGKILL)
    try:
        begin = time.monotonic()
        proc.communicate(timeout=5)
        while time.monotonic() - begin < 10 and alive(workers):
            time.sleep(0.1)
        assert alive(workers) == []
    finally:
        for pid in alive(list(names)):  # ours to clean up, agents included
            os.kill(pid, signal.SIGKILL)


def test_a_second_convert_into_the_same_out_fails_at_once_naming_the_first(photos: Path, tmp_path: Path) -> None:
    """The first run is held mid-way (its last image is a FIFO nobody has written yet) while a
    second one into the same OUT fails; released, the first finishes as if alone."""
    src, reference_src = tmp_path / "src", tmp_path / "reference-src"
    subprocess.run(["cp", "-r", str(photos), str(src)], check=True)
    subprocess.run(["cp", "-r", str(photos), str(reference_src)], check=True)
    last = jpeg_bytes(small_photo(500, 2, (64, 80)))
    (reference_src / "c2" / "zzzz.jpg").write_bytes(last)
    os.mkfifo(src / "c2" / "zzzz.jpg")
    reference = tmp_path / "reference"
    convert(str(reference_src), str(reference), ConvertOptions(source="imagefolder", samples_per_shard=2))
    out = tmp_path / "out"
    first = start(convert_args(src, out, workers=1))
    try:
        deadline = time.monotonic() + 60
        lock = out / LOCK_FILE
        while time.monotonic() < deadline and not (lock.is_file() and lock.read_text().strip() == str(first.pid)):
            time.sleep(0.01)  # until the first run holds OUT
        begin = time.monotonic()
        second = run_cli(*convert_args(src, out, workers=1), check=False)
        assert time.monotonic() - begin < 10 and second.returncode == 2
        assert second.stderr.strip().count("\n") == 0 and f"(pid {first.pid})" in second.stderr, second.stderr
    finally:
        with open(src / "c2" / "zzzz.jpg", "wb") as fifo:  # let the first run read its last image
            fifo.write(last)
    assert first.wait(timeout=120) == 0
    assert tree_bytes(out) == tree_bytes(reference)  # untouched by the second run; no lock file left
    assert not (out / LOCK_FILE).exists()


def test_resume_redoes_shards_whose_sources_changed(photos: Path, tmp_path: Path) -> None:
    """Kill a conversion, change an image an already finished shard holds, rerun: the output
    equals a fresh conversion of the changed source, byte for byte."""
    src = tmp_path / "src"
    subprocess.run(["cp", "-r", str(photos), str(src)], check=True)
    out = tmp_path / "out"
    args = convert_args(src, out, workers=1)
    proc = start(args, start_new_session=True)
    wait_for_results(proc, out, 3)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert not (out / "index.json").exists(), "the conversion ended before it could be killed: make it longer"
    assert (out / ".fastload-partial" / "shard-00000.tar.json").exists()
    changed = src / "c0" / "0000.jpg"  # the first item: in shard 0, finished before the kill
    changed.write_bytes(jpeg_bytes(small_photo(1000, 0, (64, 80))))
    rerun = run_cli(*args)
    assert re.search(r"\b1 finished earlier rewritten", rerun.stdout), rerun.stdout
    fresh = tmp_path / "fresh"
    convert(str(src), str(fresh), ConvertOptions(source="imagefolder", samples_per_shard=2))
    assert tree_bytes(out) == tree_bytes(fresh)


def limit_file_size(limit: int):  # type: ignore[no-untyped-def]
    """A preexec_fn: files may grow to ``limit`` bytes; past it a write fails with EFBIG (SIGXFSZ,
    which would kill the process, is ignored), as a full disk's writes fail with ENOSPC."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.parametrize("workers", [1, 2])
def test_a_full_disk_is_one_line_and_the_rerun_resumes(photos: Path, tmp_path: Path, workers: int) -> None:
    src = tmp_path / "src"
    subprocess.run(["cp", "-r", str(photos), str(src)], check=True)
    noise = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    (src / "c2" / "zzzz.jpg").write_bytes(jpeg_bytes(Image.fromarray(noise)))  # a large JPEG, in the last shard
    assert (src / "c2" / "zzzz.jpg").stat().st_size > 100_000
    out = tmp_path / "out"
    args = convert_args(src, out, workers=workers, per_shard=8)
    full = subprocess.run([EXE, *args], capture_output=True, text=True, env=cli_env(), preexec_fn=limit_file_size(80_000), timeout=120)
    assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr
    line = full.stderr.strip()
    assert "\n" not in line and "File too large" in line and str(out / "shard-00015.tar") in line, line
    assert not list(out.glob(".*.tmp*"))  # the broken shard's temporary file is gone
    rerun = run_cli(*args)
    resumed = re.search(r"(\d+) resumed", rerun.stdout)
    assert resumed and int(resumed.group(1)) >= 10, rerun.stdout
    fresh = tmp_path / "fresh"
    convert(str(src), str(fresh), ConvertOptions(source="imagefolder", samples_per_shard=8))
    assert tree_bytes(out) == tree_bytes(fresh)


def base256_tar(path: Path) -> Path:
    """A GNU tar whose second member's size field holds 2**62 in base-256 (checksum fixed up)."""
    data = jpeg_bytes(small_photo(1))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for key in ("a", "b"):
            info = tarfile.TarInfo(f"{key}.jpg")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = bytearray(buf.getvalue())
    at = raw.find(b"b.jpg")
    raw[at + 124 : at + 136] = b"\x80\0\0\0" + (2**62).to_bytes(8, "big")
    raw[at + 148 : at + 156] = b" " * 8
    raw[at + 148 : at + 156] = b"%06o\0 " % sum(raw[at : at + 512])
    path.write_bytes(bytes(raw))
    return path


def test_a_tar_member_with_a_bogus_base256_size_is_one_line(tmp_path: Path) -> None:
    tar = base256_tar(tmp_path / "in.tar")
    result = run_cli("convert", str(tar), str(tmp_path / "out"), "--from", "wds", "--quiet", check=False)
    line = result.stderr.strip()
    assert result.returncode == 2 and "\n" not in line and "Traceback" not in line, result.stderr
    assert str(tar) in line and "past the end of the file" in line
    skipping = run_cli("convert", str(tar), str(tmp_path / "skipping"), "--from", "wds", "--on-error", "skip", "--quiet")
    assert "skipped 2 bad samples" in skipping.stdout  # sample a (it may have lost members) and the rest of the tar
    report = (tmp_path / "skipping" / "skipped.jsonl").read_text()
    assert report.count("member 1 runs past the end of the file") == 2 and str(tar) in report
