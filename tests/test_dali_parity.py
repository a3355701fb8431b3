"""The parity contract on real photos (benchmarks/make_photos.py's crops of Debian's wallpapers):
for ``val`` and ``decode`` every backend stays within 1.5 levels mean |diff| of an independent
reference (Pillow's full decode and torchvision's recipe, fastload.bench.parity) on every image and
0.5 at the median; for ``train`` DALI and the CPU path give the same region for the same plan.
DALI runs on its CPU here; ``benchmarks/gpu_check.sh`` runs the same measurement with mixed decoding."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fastload
from benchmarks.make_photos import fetch_wallpapers, make_photos
from fastload.bench.parity import backend_pixels, measure_agreement, measure_parity
from fastload.converters import ConvertOptions, convert

pytest.importorskip("nvidia.dali")

HELD_OUT_SEED = 20  # make_photos' benchmark folders use seed 0: these crops are others
PHOTOS = 90  # 5 crops of each wallpaper: the textured ones (needles, leaves) are where DALI's rounding showed


@pytest.fixture(scope="module")
def real_photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Held-out real photos, converted, from the wallpapers scripts/env.sh fetches into
    data/.wallpapers (or those under $FASTLOAD_WALLPAPERS), as benchmarks/make_photos.py does."""
    cache = Path(os.environ.get("FASTLOAD_WALLPAPERS", Path(__file__).resolve().parents[1] / "data" / ".wallpapers"))
    if not (cache / "usr" / "share" / "wallpapers").is_dir():
        why = f"real photos need Debian's wallpapers in {cache}: scripts/env.sh fetches them (apt-get download)"
        if os.environ.get("CI"):  # CI must check parity, not skip it
            pytest.fail(why)
        pytest.skip(why)
    root = tmp_path_factory.mktemp("real-photos")
    make_photos(root / "raw", PHOTOS, fetch_wallpapers(cache), seed=HELD_OUT_SEED)
    convert(str(root / "raw"), str(root / "wds"), ConvertOptions(source="imagefolder"))
    return root / "wds"


@pytest.mark.parametrize("transform", ["val", "decode"])
@pytest.mark.parametrize("backend", ["cpu", "dali"])
def test_every_backend_is_near_the_reference_on_every_photo(real_photos: Path, backend: str, transform: str) -> None:
    parity = measure_parity(fastload.open(real_photos), backend, transform, 224, batch_size=16, num_workers=2)
    assert len(parity.per_image) == PHOTOS
    key, worst = parity.worst
    assert worst <= 1.5, f"{parity.backend} {transform}: {key} is {worst:.2f} levels from the reference"
    assert parity.median <= 0.5, parity.summary()


def test_train_plans_give_dali_and_the_cpu_path_the_same_region(real_photos: Path) -> None:
    """The same crop plan (RandomResizedCrop's box and flip, from seed, epoch and index) through both
    decoders: what is left is their decoders' and resamplers' rounding (docs/performance.md, Pixels: median 0.003, max 0.6)."""
    dataset = fastload.open(real_photos)
    _, cpu = backend_pixels(dataset, "cpu", "train", 224, batch_size=16)
    agreement = measure_agreement(dataset, "dali", cpu, "train", 224)
    assert len(agreement.per_image) == PHOTOS
    assert agreement.median <= 0.05 and agreement.worst[1] <= 1.0, agreement.summary()
