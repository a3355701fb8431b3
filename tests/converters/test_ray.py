"""Conversion on a local Ray instance: shards identical to the local engine's, also when a Ray
worker is killed mid-task; a clear message when Ray is missing."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from fastload.cli.demo import make_demo_images
from fastload.converters import ConvertOptions, convert
from tests.conftest import run_cli, tree_bytes

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo_images(tmp_path_factory.mktemp("ray-src") / "raw", 120)


OPTIONS = dict(source="imagefolder", samples_per_shard=6, shuffle=True, seed=2, reencode_quality=85, max_size=160, dedupe=True)
AS_THEY_ARE = {**OPTIONS, "reencode_quality": None, "max_size": None}  # written shard by shard (re-encoding: in runs)


@pytest.mark.parametrize("options", [OPTIONS, AS_THEY_ARE], ids=["re-encoded, in runs", "as they are, by shard"])
def test_ray_shards_equal_local_shards(ray_local: None, photos: Path, tmp_path: Path, options: dict) -> None:
    convert(str(photos), str(tmp_path / "local"), ConvertOptions(workers=2, **options))
    report = convert(str(photos), str(tmp_path / "ray"), ConvertOptions(workers=2, **options), engine="ray", quiet=True)
    assert report.index.num_samples == 120 and len(report.index.shards) == 20
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")


def test_ray_near_dedupe_equals_local(ray_local: None, photos: Path, tmp_path: Path) -> None:
    """--dedupe near on Ray: the runs signed and prepared by Ray tasks, the shards written by the
    caller behind its decisions, byte for byte what the local engine writes."""
    options = {**OPTIONS, "dedupe": False, "near_threshold": 12}
    convert(str(photos), str(tmp_path / "local"), ConvertOptions(workers=2, **options))
    report = convert(str(photos), str(tmp_path / "ray"), ConvertOptions(workers=2, **options), engine="ray", quiet=True)
    assert report.index.num_samples + report.index.duplicates == 120 and report.shards_written == len(report.index.shards)
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")


def _kill_one_task_worker(task: str, killed: list[int], stop: threading.Event) -> None:
    """SIGKILL the first Ray worker seen running a ``task`` task (Ray names the process after it)."""
    while not stop.is_set() and not killed:
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if f"ray::{task}" in cmdline:
                os.kill(proc.info["pid"], signal.SIGKILL)
                killed.append(proc.info["pid"])
                return
        time.sleep(0.01)


@pytest.mark.parametrize("task,options", [("prepare_run", OPTIONS), ("write_shard", AS_THEY_ARE)])
def test_killed_task_is_retried_and_output_is_identical(ray_local: None, photos: Path, tmp_path: Path, task: str, options: dict) -> None:
    convert(str(photos), str(tmp_path / "local"), ConvertOptions(workers=1, **options))
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=_kill_one_task_worker, args=(task, killed, stop))
    killer.start()
    try:
        convert(str(photos), str(tmp_path / "ray"), ConvertOptions(workers=2, **options), engine="ray", quiet=True)
    finally:
        stop.set()
        killer.join()
    assert killed, "no Ray task was caught running: the test did not kill anything"
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")


def test_missing_ray_names_the_extra(photos: Path, tmp_path: Path) -> None:
    script = (
        "import sys; sys.modules['ray'] = None\n"
        "from fastload.cli.command import main\n"
        f"sys.exit(main(['convert', {str(photos)!r}, {str(tmp_path / 'o')!r}, '--from', 'imagefolder', '--engine', 'ray']))\n"
    )
    import subprocess

    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "pip install 'fastload[ray]'" in proc.stderr


def test_rerun_after_a_driver_crash_resumes(photos: Path, tmp_path: Path) -> None:
    from tests.converters.test_resume import _kill_when, _start

    common = ["--from", "imagefolder", "--samples-per-shard", "6", "--reencode-quality", "85", "--max-size", "160", "--quiet"]
    run_cli("convert", str(photos), str(tmp_path / "reference"), *common)
    args = ["convert", str(photos), str(tmp_path / "out"), *common, "--engine", "ray", "--workers", "2"]
    proc = _start(args)
    _kill_when(proc, tmp_path / "out", shards_done=5, timeout=120)
    assert not (tmp_path / "out" / "index.json").exists(), "finished before the driver could be killed"
    result = run_cli(*args)
    resumed = int(result.stdout.split(" resumed")[0].rsplit(" ", 1)[-1])
    assert resumed >= 5
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "reference")
