"""backend="dali": DALI decodes the same crops, in the same order, as the CPU path. Its CPU
pipeline runs here (device_id=None); the mixed GPU path is marked ``gpu``."""

from __future__ import annotations

import gc
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

import fastload
from fastload import transforms as T
from fastload.converters import ConvertOptions, WriterOptions, convert
from fastload.errors import SampleError
from tests.conftest import cli_env, collection_page_faults, demo_dataset

pytest.importorskip("nvidia.dali")


@pytest.fixture(scope="module")
def demo_wds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twelve demo images at ImageNet-like sizes (300-640 px)."""
    return demo_dataset(tmp_path_factory.mktemp("dali-demo"), 12)


@pytest.fixture(scope="module")
def wds(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dali-wds")
    convert(str(image_folder), str(out), ConvertOptions(source="imagefolder", samples_per_shard=7))
    return out


def epoch(path: Path, backend: str, **kwargs) -> list[tuple[torch.Tensor, torch.Tensor, str]]:
    with fastload.DataLoader(path, backend=backend, return_keys=True, **kwargs) as loader:
        samples = [(x[i].cpu(), y[i].cpu(), k) for x, y, keys in loader for i, k in enumerate(keys)]
        assert loader.stats.redone_on_cpu == 0  # clean data: DALI decoded every batch itself
    return samples


@pytest.mark.parametrize("preset", [T.val(160), T.train(128)], ids=["val", "train"])
def test_dali_cpu_matches_the_cpu_path_image_by_image(demo_wds: Path, preset: tuple) -> None:
    kwargs = dict(batch_size=5, shuffle=True, seed=3, transform=preset, num_workers=2)
    cpu, dali = epoch(demo_wds, "cpu", **kwargs), epoch(demo_wds, "dali", **kwargs)
    assert len(cpu) == 12
    assert [k for *_, k in dali] == [k for *_, k in cpu]  # same order
    diffs = []
    for (a, la, _key), (b, lb, _) in zip(cpu, dali):
        assert a.shape == b.shape and a.dtype == b.dtype == torch.uint8 and torch.equal(la, lb)
        diffs.append((a.float() - b.float()).abs().mean().item())
    # same crop and flip; two decoders and resamplers differ by about a level
    assert sum(diffs) / len(diffs) < 1.5 and max(diffs) < 3, diffs


def test_dali_normalizes_like_the_cpu_path(wds: Path) -> None:
    specs = (*T.val(32), T.Normalize(dtype="float16"))
    (x_cpu, *_), (x_dali, *_) = epoch(wds, "cpu", batch_size=30, transform=specs)[0], epoch(wds, "dali", batch_size=30, transform=specs)[0]
    assert x_dali.dtype == torch.float16 and x_dali.shape == x_cpu.shape
    assert (x_cpu.float() - x_dali.float()).abs().mean() < 0.1


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "parallel-source"])
@pytest.mark.parametrize("streaming", [False, True], ids=["global-order", "streaming-order"])
def test_dali_resume_and_rank_split_equal_the_cpu_path(wds: Path, workers: int, streaming: bool) -> None:
    kwargs = dict(batch_size=4, shuffle=True, seed=5, transform=T.val(16), rank=1, world_size=2, num_workers=workers)
    if streaming:
        kwargs["shuffle_buffer"] = 6
    full = [k for *_, k in epoch(wds, "cpu", **kwargs)]
    assert [k for *_, k in epoch(wds, "dali", **kwargs)] == full
    with fastload.DataLoader(wds, backend="dali", return_keys=True, **kwargs) as loader:
        before = [k for _, _, keys in itertools.islice(iter(loader), 2) for k in keys]
        state = loader.state_dict()
    with fastload.DataLoader(wds, backend="cpu", return_keys=True, **kwargs) as loader:
        loader.load_state_dict(state)  # switch backends and resume
        after = [k for _, _, keys in loader for k in keys]
    assert before + after == full
    with fastload.DataLoader(wds, backend="cpu", return_keys=True, **kwargs) as loader:
        before = [k for _, _, keys in itertools.islice(iter(loader), 3) for k in keys]
        state = loader.state_dict()
    with fastload.DataLoader(wds, backend="dali", return_keys=True, **kwargs) as loader:
        loader.load_state_dict(state)  # and back: DALI's feed starts mid-epoch
        after = [k for _, _, keys in loader for k in keys]
    assert before + after == full


def test_dali_workers_follow_a_streaming_resume_at_another_world_size(wds: Path) -> None:
    """The re-dealt order of a resume at another world size (OrderSpec.resumed_from) is computed in
    DALI's worker processes exactly as in the loader."""
    kwargs = dict(batch_size=3, shuffle=True, seed=2, transform=T.val(16), shuffle_buffer=5)
    with fastload.DataLoader(wds, backend="cpu", rank=0, world_size=2, **kwargs) as loader:
        list(itertools.islice(iter(loader), 2))
        state = loader.state_dict()
    rest = {}
    for backend, workers in (("cpu", 0), ("dali", 2)):
        with fastload.DataLoader(wds, backend=backend, return_keys=True, num_workers=workers, **kwargs) as loader:
            loader.load_state_dict(state)
            rest[backend] = [k for _, _, keys in loader for k in keys]
    assert rest["dali"] == rest["cpu"] and len(rest["cpu"]) > 0


def test_hdf5_shards_feed_dali_through_the_parallel_source(image_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "h5"
    convert(str(image_folder), str(out), ConvertOptions(source="imagefolder", layout="hdf5", samples_per_shard=9))
    kwargs = dict(batch_size=5, shuffle=True, seed=4, transform=T.val(24), num_workers=2)
    cpu, dali = epoch(out, "cpu", **kwargs), epoch(out, "dali", **kwargs)
    assert [k for *_, k in dali] == [k for *_, k in cpu] and len(cpu) == 30
    assert [y for _, y, _ in dali] == [y for _, y, _ in cpu]
    differences = [(x_dali.float() - x_cpu.float()).abs().mean().item() for (x_dali, *_), (x_cpu, *_) in zip(dali, cpu)]
    assert sum(differences) / len(differences) < 3 and max(differences) < 10  # resampling differs a little at 24 px


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "parallel-source"])
def test_dali_epochs_after_a_full_epoch_and_after_a_break_equal_the_cpu_path(demo_wds: Path, workers: int) -> None:
    """The pipeline is reused after a clean epoch end and rebuilt after a break: every epoch keeps
    the CPU path's order and crops (a crop planned for another epoch differs by ~40+ levels),
    whether DALI's worker processes or this process read and plan the batches."""
    kwargs = dict(batch_size=4, shuffle=True, seed=9, transform=T.train(32), num_workers=workers)

    def keys_and_pixels(loader: fastload.DataLoader, limit: int | None = None) -> list[tuple[str, torch.Tensor]]:
        batches = itertools.islice(iter(loader), limit)
        return [(k, x[i]) for x, _, keys in batches for i, k in enumerate(keys)]

    with fastload.DataLoader(demo_wds, backend="cpu", return_keys=True, **kwargs) as cpu:
        expected = []
        for e in range(4):
            cpu.set_epoch(e)
            expected.append(keys_and_pixels(cpu))
    for backend in ("cpu", "dali"):  # set_epoch after a break must win on both paths
        with fastload.DataLoader(demo_wds, backend=backend, return_keys=True, **kwargs) as loader:
            got = []
            for e, limit in enumerate([None, 1, None, None]):  # full, break after one batch, full, full
                loader.set_epoch(e)
                got.append(keys_and_pixels(loader, limit))
            assert loader.stats.redone_on_cpu == 0
        for e, (want, have) in enumerate(zip(expected, got)):
            assert [k for k, _ in have] == [k for k, _ in want][: len(have)], f"{backend}, epoch {e}"
            for (_, x_have), (_, x_want) in zip(have, want):
                assert (x_have.float() - x_want.float()).abs().mean() < 20, f"{backend}, epoch {e}"
        assert len(got[1]) == 4 and len(got[3]) == len(expected[3])


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "parallel-source"])
def test_corrupt_sample_raises_or_is_skipped(corrupt: tuple[Path, set[str]], workers: int) -> None:
    path, bad = corrupt
    kwargs = dict(batch_size=4, backend="dali", transform=T.val(16), num_workers=workers)
    with fastload.DataLoader(path, **kwargs) as loader, pytest.raises(SampleError) as info:
        list(loader)
    assert info.value.where.split(":", 1)[1] in bad
    with fastload.DataLoader(path, on_error="skip", return_keys=True, **kwargs) as loader:
        batches = list(loader)
        assert [len(k) for *_, k in batches] == [4] * 7 + [2]
        assert not bad & {k for *_, ks in batches for k in ks}
        assert len(loader.stats.skipped) == 2
        assert loader.stats.redone_on_cpu == 1  # the garbage scan data; the bad header is skipped while planning
    with fastload.DataLoader(corrupt[0], shuffle=True, on_error="skip", return_keys=True, **kwargs) as loader:
        keys = [k for *_, ks in loader for k in ks]
    assert len(keys) == 30 and not bad & set(keys)  # as above, in shuffled order


def test_a_bug_in_the_feed_is_raised_not_redone_on_the_cpu(wds: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only bad samples fall back to the CPU path; a failure of the feed itself must surface."""
    import fastload.backends.dali.feed

    def broken(*args: object) -> None:
        raise AttributeError("a bug in the feed")

    monkeypatch.setattr(fastload.backends.dali.feed, "fill_beside_primary", broken)
    with fastload.DataLoader(wds, batch_size=4, backend="dali", transform=T.val(16)) as loader:
        with pytest.raises(AttributeError, match="a bug in the feed"):
            next(iter(loader))
        assert loader.stats.redone_on_cpu == 0


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "parallel-source"])
def test_dali_workers_leave_the_inherited_heap_shared(wds: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    """As with fastload's own workers: a collection in a DALI source worker leaves the objects it
    inherited alone rather than copying the training process's heap; the training process itself
    (num_workers=0) is not frozen, its garbage must still be collected."""
    import fastload.backends.dali.feed

    heap = [[i] for i in range(500_000)]  # ~50 MB of collectable objects in the training process
    plan = fastload.backends.dali.feed.fill_beside_primary

    def measured(*args: object) -> object:
        record = tmp_path / str(os.getpid())
        if not record.exists():
            record.write_text(f"{collection_page_faults()} {gc.get_freeze_count()}")
        return plan(*args)

    monkeypatch.setattr(fastload.backends.dali.feed, "fill_beside_primary", measured)
    with fastload.DataLoader(wds, batch_size=4, backend="dali", transform=T.val(16), num_workers=workers) as loader:
        assert sum(1 for _ in loader) == 8
    records = {int(p.name): tuple(map(int, p.read_text().split())) for p in tmp_path.iterdir()}
    if workers:
        assert len(records) >= 1 and os.getpid() not in records and len(heap)
        assert all(faults < 1000 for faults, _ in records.values()), records
    else:
        assert list(records) == [os.getpid()] and records[os.getpid()][1] == 0  # nothing frozen here


SPAWN_SCRIPT = """
import fastload, fastload.backends.dali.pipeline
from fastload import transforms as T

def main():
    fastload.backends.dali.pipeline.cuda_initialized = lambda: True  # as in a training process on a GPU: spawn
    with fastload.DataLoader({path!r}, batch_size=4, backend="dali", transform=T.val(16), num_workers=2) as loader:
        print("batches", sum(1 for _ in loader), "redone", loader.stats.redone_on_cpu)
{entry}
"""


@pytest.mark.parametrize("guarded", [True, False], ids=["guarded-script", "unguarded-script"])
def test_spawned_dali_workers_need_a_guarded_entry_point_and_say_so(wds: Path, tmp_path: Path, guarded: bool) -> None:
    entry = "if __name__ == '__main__':\n    main()" if guarded else "main()"
    script = tmp_path / "train.py"
    script.write_text(SPAWN_SCRIPT.format(path=str(wds), entry=entry))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=cli_env())
    if guarded:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "batches 8 redone 0" in proc.stdout
    else:
        assert proc.returncode != 0
        assert "guard its entry point with `if __name__ == '__main__':`" in proc.stderr


def test_dali_worker_processes_end_with_the_loader(wds: Path) -> None:
    me = psutil.Process()
    before = {c.pid for c in me.children(recursive=True)}
    with fastload.DataLoader(wds, batch_size=4, backend="dali", transform=T.val(16), num_workers=2) as loader:
        next(iter(loader))
        assert len({c.pid for c in me.children(recursive=True)} - before) >= 2  # DALI's source workers
    deadline = time.monotonic() + 10
    while {c.pid for c in me.children(recursive=True)} - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not {c.pid for c in me.children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE} - before


def test_auto_stays_on_cpu_without_a_gpu_and_decoded_pixels_refuse_dali(wds: Path, npz_file: Path, tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        with fastload.DataLoader(wds, batch_size=4, transform=T.val(16)) as loader:
            assert loader.backend == "cpu"
    convert(str(npz_file), str(tmp_path / "px"), ConvertOptions(source="npz", layout="hdf5", writer_options=WriterOptions(hdf5_decoded=True)))
    with pytest.raises(ValueError, match="stores decoded pixels"):
        fastload.DataLoader(tmp_path / "px", batch_size=4, backend="dali")


def test_missing_dali_names_the_extra_and_auto_falls_back(wds: Path) -> None:
    script = (
        "import sys; sys.modules['nvidia.dali'] = None\n"
        "import fastload\n"
        f"loader = fastload.DataLoader({str(wds)!r}, batch_size=4, transform=fastload.transforms.val(16))\n"
        "assert loader.backend == 'cpu' and len(list(loader)) == 8\n"
        f"fastload.DataLoader({str(wds)!r}, batch_size=4, transform=fastload.transforms.val(16), backend='dali')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "ImportError: backend='dali' needs NVIDIA DALI: pip install 'fastload[dali]'" in proc.stderr


@pytest.mark.gpu
def test_mixed_decoding_gives_cuda_tensors_like_the_cpu_path(wds: Path) -> None:
    kwargs = dict(batch_size=8, shuffle=True, seed=3, transform=T.val(32))
    with fastload.DataLoader(wds, backend="dali", return_keys=True, **kwargs) as loader:
        assert loader.backend == "dali-gpu"
        images, _labels, keys = next(iter(loader))
        assert images.is_cuda and images.dtype == torch.uint8
    cpu = epoch(wds, "cpu", **kwargs)[:8]
    assert keys == [k for *_, k in cpu]
    for image, (reference, *_rest) in zip(images.cpu(), cpu):
        assert (image.float() - reference.float()).abs().mean() < 4
