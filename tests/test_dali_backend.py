"""backend="dali": DALI decodes the same crops, in the same order, as the CPU path. Its CPU
pipeline runs here (device_id=None); the mixed GPU path is marked ``gpu``."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fastload
from converters import ConvertOptions, WriterOptions, convert
from fastload import transforms as T
from fastload.errors import SampleError

pytest.importorskip("nvidia.dali")


@pytest.fixture(scope="module")
def demo_wds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twelve demo images at ImageNet-like sizes (300-640 px)."""
    from fastload.demo import make_demo_images

    root = tmp_path_factory.mktemp("dali-demo")
    convert(str(make_demo_images(root / "raw", 12)), str(root / "wds"), ConvertOptions(source="imagefolder"))
    return root / "wds"


@pytest.fixture(scope="module")
def wds(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dali-wds")
    convert(str(image_folder), str(out), ConvertOptions(source="imagefolder", samples_per_shard=7))
    return out


def epoch(path: Path, backend: str, **kwargs) -> list[tuple[torch.Tensor, torch.Tensor, str]]:
    with fastload.DataLoader(path, backend=backend, return_keys=True, **kwargs) as loader:
        return [(x[i].cpu(), y[i].cpu(), k) for x, y, keys in loader for i, k in enumerate(keys)]


@pytest.mark.parametrize("preset", [T.val(160), T.train(128)], ids=["val", "train"])
def test_dali_cpu_matches_the_cpu_path_image_by_image(demo_wds: Path, preset: tuple) -> None:
    kwargs = dict(batch_size=5, shuffle=True, seed=3, transform=preset, num_workers=2)
    cpu, dali = epoch(demo_wds, "cpu", **kwargs), epoch(demo_wds, "dali", **kwargs)
    assert len(cpu) == 12
    assert [k for *_, k in dali] == [k for *_, k in cpu]  # same order
    diffs = []
    for (a, la, key), (b, lb, _) in zip(cpu, dali):
        assert a.shape == b.shape and a.dtype == b.dtype == torch.uint8 and torch.equal(la, lb)
        diffs.append((a.float() - b.float()).abs().mean().item())
    # same crop and flip; two decoders and resamplers differ by about a level
    assert sum(diffs) / len(diffs) < 1.5 and max(diffs) < 3, diffs


def test_dali_normalizes_like_the_cpu_path(wds: Path) -> None:
    specs = (*T.val(32), T.Normalize(dtype="float16"))
    (x_cpu, *_), (x_dali, *_) = epoch(wds, "cpu", batch_size=30, transform=specs)[0], epoch(wds, "dali", batch_size=30, transform=specs)[0]
    assert x_dali.dtype == torch.float16 and x_dali.shape == x_cpu.shape
    assert (x_cpu.float() - x_dali.float()).abs().mean() < 0.1


def test_dali_resume_and_rank_split_equal_the_cpu_path(wds: Path) -> None:
    kwargs = dict(batch_size=4, shuffle=True, seed=5, transform=T.val(16), rank=1, world_size=2)
    assert [k for *_, k in epoch(wds, "dali", **kwargs)] == [k for *_, k in epoch(wds, "cpu", **kwargs)]
    with fastload.DataLoader(wds, backend="dali", return_keys=True, **kwargs) as loader:
        before = [k for _, _, keys in itertools.islice(iter(loader), 2) for k in keys]
        state = loader.state_dict()
    with fastload.DataLoader(wds, backend="cpu", return_keys=True, **kwargs) as loader:
        loader.load_state_dict(state)  # switch backends and resume
        after = [k for _, _, keys in loader for k in keys]
    assert before + after == [k for *_, k in epoch(wds, "cpu", **kwargs)]


def test_corrupt_sample_raises_or_is_skipped(corrupt: tuple[Path, set[str]]) -> None:
    path, bad = corrupt
    with fastload.DataLoader(path, batch_size=4, backend="dali", transform=T.val(16)) as loader:
        with pytest.raises(SampleError) as info:
            list(loader)
    assert info.value.where.split(":", 1)[1] in bad
    with fastload.DataLoader(path, batch_size=4, backend="dali", transform=T.val(16), on_error="skip", return_keys=True) as loader:
        batches = list(loader)
        assert [len(k) for *_, k in batches] == [4] * 7 + [2]
        assert not bad & {k for *_, ks in batches for k in ks}
        assert len(loader.stats.skipped) == 2


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
        images, labels, keys = next(iter(loader))
        assert images.is_cuda and images.dtype == torch.uint8
    cpu = epoch(wds, "cpu", **kwargs)[:8]
    assert keys == [k for *_, k in cpu]
    for image, (reference, *_rest) in zip(images.cpu(), cpu):
        assert (image.float() - reference.float()).abs().mean() < 4
