"""DALI's video path (``backend="dali"`` with ``clip=``): clips decoded by DALI's in-memory video
decoder hold the CPU path's frames, crops and flips, in the same order; a batch DALI cannot decode
is redone on the CPU path, which names or skips the bad video. DALI's CPU device (VP9 here: its
CPU decoder has no H.264) runs wherever DALI is installed; NVDEC on the ``mixed`` device only with
``pytest -m gpu`` on a GPU machine."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import fastload
from fastload import Clip
from fastload import transforms as T
from fastload.converters import ConvertOptions, convert
from fastload.formats.index import read_index
from tests.video.media import video


def loader(dataset: Path, backend: str, **options) -> fastload.DataLoader:
    settings = {"batch_size": 3, "shuffle": True, "seed": 4, "return_keys": True, **options}
    return fastload.DataLoader(dataset, backend=backend, clip=Clip(frames=6, stride=2, clips=2), transform=T.train(32), **settings)


def assert_same_clips(got: fastload.DataLoader, want: fastload.DataLoader) -> None:
    """The same keys, labels and clips, but for the two YUV-to-RGB conversions' and resamplers' rounding."""
    for (clips, labels, keys), (expected, expected_labels, expected_keys) in zip(got, want, strict=True):
        assert clips.shape == expected.shape == (3, 2, 6, 3, 32, 32) and keys == expected_keys
        assert torch.equal(labels.cpu(), expected_labels)
        difference = (clips.cpu().int() - expected.int()).abs()
        assert difference.float().mean() < 2.5 and difference.max() <= 40


@pytest.fixture(scope="module")
def vp9_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vp9")
    for i in range(6):
        path = root / "raw" / f"c{i % 2}" / f"v{i}.webm"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(video(i, 24 + 4 * i, codec="libvpx-vp9", container="webm", gop=8))
    convert(str(root / "raw"), str(root / "wds"), ConvertOptions(source="videos", samples_per_shard=4), quiet=True)
    return root / "wds"


def test_dali_on_the_cpu_gives_the_cpu_paths_clips(vp9_dataset: Path) -> None:
    pytest.importorskip("nvidia.dali")
    if torch.cuda.is_available():
        pytest.skip("DALI's CPU device: with a GPU backend='dali' decodes on it (the gpu tests)")
    dali = loader(vp9_dataset, "dali")
    assert dali.backend == "dali-cpu"
    assert_same_clips(dali, loader(vp9_dataset, "cpu"))
    assert dali.stats.redone_on_cpu == 0


def test_a_batch_dali_cannot_decode_is_redone_on_the_cpu_path(video_dataset: Path) -> None:
    pytest.importorskip("nvidia.dali")
    if torch.cuda.is_available():
        pytest.skip("on a GPU, NVDEC decodes H.264")
    dali = loader(video_dataset, "dali")  # H.264: DALI's CPU decoder has none
    for (clips, _, keys), (expected, _, expected_keys) in zip(dali, loader(video_dataset, "cpu"), strict=True):
        assert keys == expected_keys and torch.equal(clips, expected)
    assert dali.stats.redone_on_cpu == 2


@pytest.mark.gpu
def test_nvdec_clips_equal_the_cpu_paths(video_dataset: Path) -> None:
    pytest.importorskip("nvidia.dali")
    dali = loader(video_dataset, "dali")
    assert dali.backend == "dali-gpu"
    assert_same_clips(dali, loader(video_dataset, "cpu"))
    assert dali.stats.redone_on_cpu == 0


@pytest.mark.gpu
def test_a_video_nvdec_cannot_decode_is_named_or_skipped_by_the_cpu_path(video_dataset: Path, tmp_path: Path) -> None:
    pytest.importorskip("nvidia.dali")
    copy = tmp_path / "copy"
    shutil.copytree(video_dataset, copy)
    ds = fastload.open(copy)
    offset, size = ds.reader(0).spans(0)["mp4"]
    key = ds.key_of(0)
    ds.close()
    with open(copy / read_index(copy).shards[0].path, "r+b") as f:
        f.seek(offset)
        f.write(b"\0" * size)
    with pytest.raises(fastload.SampleError, match=f"{key}: not a readable video"):
        list(loader(copy, "dali", shuffle=False))
    skipping = loader(copy, "dali", on_error="skip")
    keys = [k for _, _, keys in skipping for k in keys]
    assert key not in keys and len(skipping.stats.skipped) == 1
