"""GPU-only checks (``pytest -m gpu`` on a GPU machine; skipped elsewhere): batches arrive as
CUDA tensors through pinned memory, batch-level transforms run on the device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fastload
from fastload import transforms as T
from fastload.converters import ConvertOptions, convert

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def wds(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu-wds")
    convert(str(image_folder), str(out), ConvertOptions(source="imagefolder", samples_per_shard=8))
    return out


@pytest.mark.parametrize("backend", ["cpu", "dali"])
def test_batches_land_on_the_gpu_normalized_there(wds: Path, backend: str) -> None:
    """Through pinned memory and a copy (cpu), or straight from DALI's GPU buffers (dali)."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    specs = (*T.val(32), T.Normalize(dtype="bfloat16"))
    with fastload.DataLoader(wds, batch_size=8, num_workers=2, transform=specs, pin_memory=True, device="cuda", backend=backend) as loader:
        batches = list(loader)
    images, labels = batches[0]
    assert images.is_cuda and labels.is_cuda
    assert images.dtype == torch.bfloat16 and images.shape == (8, 3, 32, 32)
    with fastload.DataLoader(wds, batch_size=8, transform=T.val(32), backend="cpu") as cpu_loader:
        cpu_images, cpu_labels = next(iter(cpu_loader))
    mean = torch.tensor(T.IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(T.IMAGENET_STD).view(1, 3, 1, 1)
    expected = (cpu_images.float() / 255 - mean) / std
    if backend == "cpu":
        assert torch.allclose(images.float().cpu(), expected, atol=0.05)
    else:  # DALI's decoder and resize: close on average (0.07 here is ~4 levels of 255)
        assert (images.float().cpu() - expected).abs().mean() < 0.07
    assert torch.equal(labels.cpu(), cpu_labels)
