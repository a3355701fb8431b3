"""``fastload bench`` runs every requested loader on the same data and reports the documented JSON."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastload.bench import time_batches
from fastload.cli.demo import make_demo_images
from fastload.converters import ConvertOptions, convert
from tests.conftest import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
FIELDS = {
    "loader", "workers", "images_per_s", "running_images_per_s", "mb_per_s", "cpu_s_per_1k", "peak_rss_mb", "first_batch_s",
    "ratio_to_torch", "ratio_to_ceiling", "ratio_to_parallel",
}


@pytest.fixture(scope="module")
def bench_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bench")
    raw = make_demo_images(root / "raw", 48)
    convert(str(raw), str(root / "wds"), ConvertOptions(source="imagefolder", samples_per_shard=16))
    return raw, root / "wds"


def test_bench_all_cpu_loaders_json_and_stall(bench_data: tuple[Path, Path], tmp_path: Path) -> None:
    raw, wds = bench_data
    pytest.importorskip("nvidia.dali")
    out = tmp_path / "bench.json"
    result = run_cli(
        "bench", str(wds), "--source", str(raw), "--backends", "fastload-cpu,torch,webdataset,dali-cpu",
        "--workers", "0,1", "--batch-size", "16", "--transform", "val", "--model", "resnet_small", "--steps", "2",
        "--gpu-price", "2.0", "--json", str(out), "--plot", str(tmp_path / "plot.png"),
    )
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads(out.read_text())
    rows = {(r["loader"], r["workers"]): r for r in report["results"]}
    assert set(rows) == {(b, w) for b in ("fastload-cpu", "torch", "webdataset", "dali-cpu") for w in (0, 1)}
    for row in rows.values():
        assert set(row) == FIELDS
        assert row["images_per_s"] > 0 and row["cpu_s_per_1k"] > 0 and row["peak_rss_mb"] > 0
    single = report["ceiling"]["single_thread_images_per_s"]
    assert single > 0 and report["machine"]["cpus"] >= 1
    for (_loader, workers), row in rows.items():  # each against torch at its own worker count
        assert row["ratio_to_torch"] == pytest.approx(row["images_per_s"] / rows[("torch", workers)]["images_per_s"])
        assert row["ratio_to_ceiling"] == pytest.approx(row["images_per_s"] / (single * max(workers, 1)))
    stall = report["data_stall"]
    assert 0 <= stall["stall_share"] <= 1 and stall["model_images_per_s"] > 0 and stall["verdict"]
    assert "fastload-cpu" in result.stdout and "data stall (resnet_small" in result.stdout
    assert "one epoch of 48 images" in result.stdout


def test_bench_measures_decoders_running_at_once(bench_data: tuple[Path, Path], tmp_path: Path) -> None:
    """Beside the ceiling (one thread's rate x workers), as many threads decoding at once: what this
    machine's cores deliver together, and the loader's ratio to that."""
    out = tmp_path / "bench.json"
    result = run_cli(
        "bench", str(bench_data[1]), "--backends", "fastload-cpu", "--workers", "1,2", "--batch-size", "16",
        "--transform", "val", "--json", str(out),
    )
    report = json.loads(out.read_text())
    single = report["ceiling"]["single_thread_images_per_s"]
    together = report["ceiling"]["parallel_images_per_s"]
    # two threads on two cores: not above 3x one (2.56x seen when noise slowed the one-thread
    # measurement in a CI run); not far below one either (a busy second core can hold them near
    # one thread's rate, so "above one" is no test on a shared machine)
    assert set(together) == {"2"} and 0.5 * single < together["2"] < 3.0 * single
    rows = {r["workers"]: r for r in report["results"]}
    assert rows[2]["ratio_to_parallel"] == pytest.approx(rows[2]["images_per_s"] / together["2"])
    for workers, ceiling in ((1, single), (2, 2 * single)):
        assert rows[workers]["ratio_to_ceiling"] == pytest.approx(rows[workers]["images_per_s"] / ceiling)
    assert rows[1]["ratio_to_parallel"] == pytest.approx(rows[1]["images_per_s"] / single)  # one thread at once
    assert rows[2]["ratio_to_parallel"] != pytest.approx(rows[2]["ratio_to_ceiling"])  # 2 threads measured, not 2 x one
    assert f"decoding at once: {together['2']:.0f} with 2 threads" in result.stdout and "x at once" in result.stdout


def test_bench_needs_a_known_backend(bench_data: tuple[Path, Path]) -> None:
    proc = run_cli("bench", str(bench_data[1]), "--backends", "nope", check=False)
    assert proc.returncode == 2 and "unknown loader 'nope'" in proc.stderr


def test_bench_on_decoded_pixels_has_no_ceiling(npz_file: Path, tmp_path: Path) -> None:
    """A dataset of decoded pixels has no JPEG to measure a ceiling on: the table says so and the
    JSON holds nulls; --size sets the transform's output."""
    from fastload.converters import WriterOptions

    decoded = tmp_path / "dec"
    options = ConvertOptions(source="npz", layout="hdf5", writer_options=WriterOptions(hdf5_decoded=True))
    convert(str(npz_file), str(decoded), options)
    out = tmp_path / "bench.json"
    result = run_cli(
        "bench", str(decoded), "--backends", "fastload-cpu,torch", "--workers", "1", "--batch-size", "4",
        "--size", "8", "--json", str(out),
    )
    report = json.loads(out.read_text())
    assert report["ceiling"]["single_thread_images_per_s"] is None and report["config"]["size"] == 8
    assert all(r["ratio_to_ceiling"] is None and r["images_per_s"] > 0 for r in report["results"])
    assert "decode ceiling: none (no JPEG images)" in result.stdout


def test_the_running_rate_leaves_start_up_out() -> None:
    """A loader slow to start (0.3 s) then quick (10 batches of 8, 10 ms each): the overall rate
    counts the start, the running rate only what follows the first batch."""

    class SlowStart:
        def __iter__(self) -> Iterator[tuple[list[int]]]:
            time.sleep(0.3)
            for _ in range(10):
                time.sleep(0.01)
                yield ([0] * 8,)

    rates = time_batches(SlowStart, epochs=1, mean_bytes=1.0)
    assert rates["first_batch_s"] >= 0.3
    assert rates["images_per_s"] < 80 / 0.39  # 80 images in at least 0.4 s
    assert rates["running_images_per_s"] > 72 / 0.2  # 72 images in ~0.09 s (0.2 s on a busy machine)
