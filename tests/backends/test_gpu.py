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


@pytest.mark.parametrize("backend", ["dali", "hybrid"])
def test_dali_and_hybrid_batches_are_cuda_tensors_in_the_cpu_paths_order(wds: Path, backend: str) -> None:
    """Without device=: DALI's images are CUDA tensors straight from its buffers (the hybrid's CPU
    part is copied to them); labels, order and pixels as the CPU path's."""
    pytest.importorskip("nvidia.dali")
    kwargs = dict(batch_size=8, shuffle=True, seed=3, num_workers=2, transform=T.val(32), return_keys=True)
    with fastload.DataLoader(wds, backend=backend, **kwargs) as loader:
        assert loader.backend == f"{backend}-gpu"
        gpu = [(x, y, keys) for x, y, keys in loader]
    with fastload.DataLoader(wds, backend="cpu", **kwargs) as loader:
        cpu = [(x, y, keys) for x, y, keys in loader]
    assert [keys for *_, keys in gpu] == [keys for *_, keys in cpu]
    for (x_gpu, y_gpu, _), (x_cpu, y_cpu, _) in zip(gpu, cpu, strict=True):
        assert x_gpu.is_cuda and x_gpu.dtype == torch.uint8 and torch.equal(y_gpu.cpu(), y_cpu)
        assert (x_gpu.cpu().float() - x_cpu.float()).abs().mean() < 4  # nvJPEG's IDCT and upsampling differ a little


@pytest.mark.parametrize("backend", ["dali", "hybrid"])
def test_images_never_come_back_to_the_host(wds: Path, backend: str, tmp_path: Path) -> None:
    """No device-to-host copy of image size while batches are made (CUPTI sees every copy in the
    process, DALI's own included); the hybrid's CPU part goes host to device only."""
    pytest.importorskip("nvidia.dali")
    import json

    from torch.profiler import ProfilerActivity, profile

    image_bytes = 3 * 32 * 32
    with fastload.DataLoader(wds, backend=backend, batch_size=8, num_workers=2, transform=T.val(32), device="cuda") as loader:
        list(loader)  # a first epoch: the pipeline built (the next one carries on)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            images = [x for x, _ in loader]
            torch.cuda.synchronize()
    assert all(x.is_cuda for x in images)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    if not any(e.get("cat") in ("kernel", "gpu_memcpy") for e in events):
        pytest.skip("the profiler recorded no GPU activity here (CUPTI unavailable)")
    back = [e for e in copies if "DtoH" in e.get("name", "") and e.get("args", {}).get("bytes", 0) >= image_bytes]
    assert not back, back[:3]
