"""Conversion is atomic and resumable: SIGKILL at any moment, rerun, get byte-identical output;
``--workers 2`` writes exactly what ``--workers 1`` writes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import cli_env, photo_folder, run_cli, tree_bytes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def many_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = photo_folder(tmp_path_factory.mktemp("many"), 240)
    (root / "c0" / "0000.jpg").write_bytes(b"")  # one bad file, skipped and reported
    return root


def convert_args(src: Path, out: Path, layout: str, workers: int, dedupe: str = "exact", *extra: str) -> list[str]:
    return [
        "convert", str(src), str(out), "--from", "imagefolder", "--to", layout, "--samples-per-shard", "4",
        "--shuffle", "--seed", "3", "--on-error", "skip", "--dedupe", dedupe, "--workers", str(workers), "--quiet", *extra,
    ]


@pytest.mark.parametrize("layout", ["wds", "hdf5"])
def test_workers_2_equals_workers_1(many_images: Path, tmp_path: Path, layout: str) -> None:
    run_cli(*convert_args(many_images, tmp_path / "one", layout, 1))
    run_cli(*convert_args(many_images, tmp_path / "two", layout, 2))
    one, two = tree_bytes(tmp_path / "one"), tree_bytes(tmp_path / "two")
    assert len(one) > 60 and one == two


def _start(args: list[str]) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("fastload")
    return subprocess.Popen([str(exe), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, env=cli_env())


def _kill_when(proc: subprocess.Popen, out: Path, shards_done: int, timeout: float = 60) -> None:
    """SIGKILL the whole process group once ``shards_done`` shard results exist (or at exit)."""
    partial = out / ".fastload-partial"
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if partial.is_dir() and len(list(partial.glob("shard-*.json"))) >= shards_done:
            break
        time.sleep(0.005)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.mark.parametrize("layout,workers,dedupe,extra", [
    ("wds", 1, "exact", ()), ("wds", 2, "exact", ()), ("hdf5", 2, "exact", ()), ("wds", 2, "near", ()),
    ("wds", 2, "exact", ("--max-size", "24", "--reencode-quality", "80")),  # re-encoded: written in runs
])
def test_sigkill_and_rerun_is_byte_identical(
    many_images: Path, tmp_path: Path, layout: str, workers: int, dedupe: str, extra: tuple[str, ...]
) -> None:
    reference = tmp_path / "reference"
    run_cli(*convert_args(many_images, reference, layout, workers, dedupe, *extra))
    out = tmp_path / "killed"
    args = convert_args(many_images, out, layout, workers, dedupe, *extra)
    killed_mid_way = 0
    for shards_done in (0, 3, 11, 25, 40):
        proc = _start(args)
        _kill_when(proc, out, shards_done)
        if proc.returncode == -signal.SIGKILL and not (out / "index.json").exists():
            killed_mid_way += 1
            assert tree_bytes(out) != tree_bytes(reference)
    assert killed_mid_way >= 3, "the conversion finished before it could be killed: make it longer"
    result = run_cli(*args)
    resumed = re.search(r"(\d+) resumed", result.stdout)
    assert resumed and int(resumed.group(1)) > 0, result.stdout
    assert tree_bytes(out) == tree_bytes(reference)
    verify = run_cli("verify", str(out))
    assert "OK" in verify.stdout


def test_a_kill_while_the_bookkeeping_is_removed_never_lends_old_shards_to_other_options(
    many_images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finished conversion's bookkeeping is renamed away before it is deleted: a kill part-way
    through the deletion (simulated: the plan gone, then the process stops) leaves OUT finished,
    and a rerun with other options is refused rather than keeping shards made with the old ones.
    Shard results found without their plan are never trusted either."""
    from fastload.converters import ConvertOptions, convert, partial
    from fastload.converters.conversion import ConversionConflict

    def killed_part_way(path: Path, ignore_errors: bool = False) -> None:
        if path.name.endswith(partial.REMOVED_SUFFIX) and (path / "plan.json").exists():
            (path / "plan.json").unlink()
            raise KeyboardInterrupt("killed while deleting the bookkeeping")

    out, small = tmp_path / "out", ConvertOptions(source="imagefolder", samples_per_shard=8, max_size=16, on_error="skip")
    monkeypatch.setattr(partial.shutil, "rmtree", killed_part_way)
    with pytest.raises(KeyboardInterrupt):
        convert(str(many_images), str(out), small)
    monkeypatch.undo()
    assert (out / "index.json").exists() and not (out / partial.PARTIAL_DIR).exists()
    with pytest.raises(ConversionConflict, match="other options"):
        convert(str(many_images), str(out), ConvertOptions(source="imagefolder", samples_per_shard=8, on_error="skip"))
    (out / partial.PARTIAL_DIR).mkdir()
    (out / partial.PARTIAL_DIR / "shard-00000.tar.json").write_text("{}")
    (out / "index.json").unlink()
    with pytest.raises(ConversionConflict, match="without the plan"):
        convert(str(many_images), str(out), small)


def test_a_resumed_decoded_hdf5_conversion_whose_first_image_changed_equals_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--hdf5-decoded takes the dataset's pixel shape from its first image: replace it with one of
    another size between a killed run and its rerun, and the shards kept from the first run (of
    the old shape) are written again, so the output is a fresh conversion's, byte for byte."""
    import numpy as np
    from PIL import Image

    from fastload.converters import ConvertOptions, WriterOptions, conversion, convert

    def image(path: Path, side: int, value: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((side, side, 3), value, np.uint8)).save(path)

    src = tmp_path / "src"
    for i in range(3):
        image(src / "c" / f"{i}.png", 8, 50 * (i + 1))
    options = ConvertOptions(source="imagefolder", layout="hdf5", samples_per_shard=1, on_error="skip", writer_options=WriterOptions(hdf5_decoded=True))

    def killed(*args: object) -> None:
        raise KeyboardInterrupt("killed before index.json")

    with monkeypatch.context() as patch:
        patch.setattr(conversion, "write_index", killed)
        with pytest.raises(KeyboardInterrupt):
            convert(str(src), str(tmp_path / "out"), options, quiet=True)
    time.sleep(0.01)
    image(src / "c" / "0.png", 16, 200)
    report = convert(str(src), str(tmp_path / "out"), options, quiet=True)
    assert report.index.decoded_shape == (16, 16, 3) and report.shards_changed == 3
    convert(str(src), str(tmp_path / "fresh"), options, quiet=True)
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "fresh")
