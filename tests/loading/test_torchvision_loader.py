"""torchvision (and timm) pipelines given as ``transform=`` to a fast-path loader: the translated
steps run as specs, the rest by torchvision in the real workers, before the user's own ``map=``.
Needs torchvision: run by scripts/test_torchvision.sh (FASTLOAD_TV_VENV=/work/tv-venv to reuse one)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
from torchvision.transforms import v2  # noqa: E402

import fastload  # noqa: E402
from fastload import transforms as T  # noqa: E402
from fastload.errors import SampleError  # noqa: E402
from tests.conftest import jpeg_bytes, png_bytes, run_cli  # noqa: E402

pytestmark = pytest.mark.torchvision
COLOURS = np.array([[220, 30, 30], [30, 220, 30], [30, 30, 220], [230, 230, 230]], dtype=np.uint8)


@pytest.fixture(scope="module")
def mask_tars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tars of KEY.jpg + KEY.seg.png: four colour regions split at a random point, the mask their class ids."""
    root = tmp_path_factory.mktemp("tv-masks")
    rng = np.random.default_rng(3)
    with tarfile.open(root / "00000.tar", "w") as tar:
        for i in range(12):
            height, width = int(rng.integers(48, 72)), int(rng.integers(48, 72))
            by, bx = int(rng.integers(12, height - 12)), int(rng.integers(12, width - 12))
            classes = (2 * (np.arange(height)[:, None] >= by) + (np.arange(width)[None, :] >= bx)).astype(np.uint8)
            for name, data in (("jpg", jpeg_bytes(Image.fromarray(COLOURS[classes]), quality=97, subsampling=0)),
                               ("seg.png", png_bytes(Image.fromarray(classes, mode="L")))):
                member = tarfile.TarInfo(f"m{i:03d}.{name}")
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
    run_cli("index", str(root))
    return root


def batches(path: Path, workers: int = 0, state: dict | None = None, stop_after: int | None = None, **kwargs) -> tuple[list, dict]:
    dl = fastload.DataLoader(str(path), batch_size=6, num_workers=workers, backend="cpu", shuffle=True, seed=3, **kwargs)
    if state is not None:
        dl.load_state_dict(state)
    out = []
    for batch in dl:
        out.append(tuple(t.clone() for t in batch))
        if stop_after is not None and len(out) == stop_after:
            break
    return out, dl.state_dict()


def test_compose_runs_its_rest_in_the_workers_deterministically_and_resumes(clean: Path) -> None:
    recipe = v2.Compose([v2.RandomResizedCrop(32), v2.ColorJitter(0.4, 0.4, 0.4), v2.RandomHorizontalFlip(),
                         v2.ToDtype(torch.float32, scale=True)])
    first, _ = batches(clean, 2, transform=recipe)
    inline, _ = batches(clean, 0, transform=recipe)
    head, state = batches(clean, 2, stop_after=2, transform=recipe)
    tail, _ = batches(clean, 1, state=state, transform=recipe)
    assert len(first) == 5 and first[0][0].shape == (6, 3, 32, 32) and first[0][0].dtype == torch.float32
    for got in (inline, head + tail):
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, first, strict=True))
    specs_only, _ = batches(clean, 0, transform=(T.RandomResizedCrop(32), T.ToDtype("float32", True)))
    assert not torch.equal(specs_only[0][0], first[0][0])  # the jitter did run


def test_the_rest_runs_before_the_user_map_which_sees_its_result(clean: Path) -> None:
    def halve(sample: dict, rng: np.random.Generator) -> dict:
        sample["image"] = sample["image"] // 2
        return sample

    translated = (T.Resize(32), T.CenterCrop(32))
    plain, _ = batches(clean, transform=translated)
    both, _ = batches(clean, 2, transform=v2.Compose([v2.Resize(32), v2.CenterCrop(32), v2.RandomInvert(p=1.0)]), map=halve)
    for (images, labels), (mine, my_labels) in zip(plain, both, strict=True):
        assert torch.equal(mine, (255 - images) // 2) and torch.equal(labels, my_labels)  # invert, then halve: not the reverse


def test_untranslated_geometric_steps_move_the_masks_too(mask_tars: Path) -> None:
    fields = {"jpg": "image", "seg.png": "mask"}
    crop = (T.RandomResizedCrop(32, scale=(0.3, 1.0)), T.RandomHorizontalFlip())
    plain, _ = batches(mask_tars, transform=crop, fields=fields)
    recipe = v2.Compose([v2.RandomResizedCrop(32, scale=(0.3, 1.0)), v2.RandomHorizontalFlip(), v2.RandomVerticalFlip(p=1.0)])
    flipped, _ = batches(mask_tars, 2, transform=recipe, fields=fields)
    for (images, masks), (mine, my_masks) in zip(plain, flipped, strict=True):
        assert my_masks.shape == (len(images), 32, 32) and my_masks.dtype == torch.uint8
        assert torch.equal(mine, images.flip(-2)) and torch.equal(my_masks, masks.flip(-2))


def test_a_rest_that_changes_the_size_or_dtype_names_the_sample_and_field(clean: Path) -> None:
    for recipe, reason in ((v2.Compose([v2.Resize(32), v2.CenterCrop(32), v2.Pad(2)]), "map= returned image as uint8[3, 36, 36]"),
                           (v2.Compose([v2.Resize(32), v2.CenterCrop(32), v2.ToDtype(torch.float32, scale=True), v2.RandomInvert()]),
                            "keep field 'image' uint8")):
        for workers in (0, 2):
            with pytest.raises(SampleError) as caught:
                batches(clean, workers, transform=recipe)
            assert caught.value.where.startswith("shard-") and ":" in caught.value.where and reason in caught.value.reason


def test_timm_create_transform_runs_translated(clean: Path) -> None:
    timm_data = pytest.importorskip("timm.data")
    recipe = timm_data.create_transform(32, is_training=True)  # RandomResizedCropAndInterpolation, flip, ColorJitter, MaybeToTensor, Normalize
    (images, _), *_ = batches(clean, 2, transform=recipe)[0]
    assert images.shape == (6, 3, 32, 32) and images.dtype == torch.float32 and -3 < float(images.mean()) < 3
    train = fastload.DataLoader(str(clean), batch_size=6, backend="cpu", transform=recipe).options
    crop, flip, normalize = train.transform
    assert (crop, flip) == (T.RandomResizedCrop(32), T.RandomHorizontalFlip()) and isinstance(normalize, T.Normalize)
    assert np.allclose(normalize.mean, T.IMAGENET_MEAN) and np.allclose(normalize.std, T.IMAGENET_STD)
    assert [type(step).__name__ for step in train.torchvision_steps.steps] == ["ColorJitter"]
    val = fastload.DataLoader(str(clean), batch_size=6, backend="cpu", transform=timm_data.create_transform(32)).options
    assert val.transform[:2] == (T.Resize(36), T.CenterCrop(32)) and val.torchvision_steps is None


def test_dali_refuses_a_compose_that_needs_torchvision(clean: Path) -> None:
    pytest.importorskip("nvidia.dali")
    with pytest.raises(ValueError, match="ColorJitter run by torchvision in the CPU workers"):
        fastload.DataLoader(str(clean), batch_size=4, backend="dali", transform=v2.Compose([v2.Resize(32), v2.CenterCrop(32), v2.ColorJitter(0.4)]))
