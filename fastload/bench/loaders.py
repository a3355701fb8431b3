"""The loaders ``fastload bench`` compares: fastload's own and the baselines, each on the same
data with the same crops and flips: a torch DataLoader over Pillow (what users write by hand),
webdataset's own pipeline, and DALI's own pipeline (readers.webdataset + decoders.image_random_crop)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

from fastload.fields import LABEL_FIELD, image_field
from fastload.formats.shard_files import offsets_name
from fastload.storage.dataset import ShardedDataset

BACKENDS = ("fastload-cpu", "fastload-dali", "fastload-hybrid", "torch", "webdataset", "dali-cpu", "dali-gpu")
LABEL_DIGITS = 8


def make_loader(name: str, ds: ShardedDataset, source: Path | None, specs: tuple, batch_size: int, workers: int) -> Callable[[], Iterable]:
    """A factory of one epoch-iterable loader of the given kind."""
    import torch

    if name in ("fastload-cpu", "fastload-dali", "fastload-hybrid"):
        from fastload.loader import DataLoader

        backend = name.split("-")[1]
        return lambda: DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers, transform=specs, backend=backend)
    if name == "torch":
        dataset = PillowImages(specs, folder=source) if source else PillowImages(specs, shards=ds)
        # a map-style dataset by duck typing: torch (imported lazily here) annotates Dataset
        return lambda: torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers)  # type: ignore[arg-type]
    if name == "webdataset":
        return _webdataset_loader(ds, specs, batch_size, workers)
    if name in ("dali-cpu", "dali-gpu"):
        return _dali_loader(ds, specs, batch_size, workers, gpu=name == "dali-gpu")
    raise ValueError(f"unknown loader {name!r}; expected one of {BACKENDS}")


class PillowImages:
    """Pillow decode + the same geometric specs as fastload (same crop params and flips), giving
    CHW uint8 tensors: over a raw image folder, or over the shards by random access. A map-style
    dataset for torch's DataLoader."""

    def __init__(self, specs: tuple, folder: Path | None = None, shards: ShardedDataset | None = None) -> None:
        self.specs = specs
        self.shards = shards
        self.items: list[tuple[str, int]] = []
        if folder is not None:
            classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
            self.items = [(str(p), label) for label, c in enumerate(classes) for p in sorted((folder / c).iterdir())]

    def __len__(self) -> int:
        return len(self.items) if self.items else len(cast(ShardedDataset, self.shards))  # one of the two is given

    def _open(self, i: int) -> tuple[Any, int]:
        from PIL import Image

        if self.items:
            path, label = self.items[i]
            return Image.open(path), label
        import io

        _, fields, pixels = cast(ShardedDataset, self.shards).raw(i)
        label = int(fields.get(LABEL_FIELD, b"-1"))
        if pixels is not None:  # a dataset of decoded pixels
            return Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels), label
        field = image_field(fields)
        if field is None:
            raise ValueError(f"sample {i} has no image field")
        return Image.open(io.BytesIO(fields[field])), label

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from fastload.workers.rng import sample_rng

        image, label = self._open(i)
        with image:
            return pillow_transform(image, self.specs, sample_rng(0, 0, i)), label


def pillow_transform(image: Any, specs: tuple, rng: Any) -> Any:
    """A Pillow image cropped, resized (bilinear) and flipped as fastload plans ``specs`` with
    ``rng``: a CHW uint8 tensor."""
    import numpy as np
    import torch
    from PIL import Image

    from fastload.transforms import plan

    image = image.convert("RGB")
    p = plan(specs, image.height, image.width, rng)
    image = image.resize((p.size[1], p.size[0]), Image.Resampling.BILINEAR, box=p.box)
    if p.flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)


def _local_tars(ds: ShardedDataset, reader: str) -> Path:
    """The folder of ``ds``'s tar shards; other readers' pipelines need local tars."""
    if not ds.layout.offsets_beside or ds.root is None:
        raise ValueError(f"{reader} reads local tar shards")
    return ds.root


def _webdataset_loader(ds: ShardedDataset, specs: tuple, batch_size: int, workers: int) -> Callable[[], Iterable]:
    """The webdataset library's own pipeline over the same tars: shard shuffle, sample shuffle,
    Pillow decode, the same crop and flip, batching in the workers."""
    import numpy as np

    try:
        import webdataset as wds
    except ImportError:
        raise ImportError("--backends webdataset needs the webdataset library: pip install 'fastload[bench]'") from None

    root = _local_tars(ds, "the webdataset loader")
    urls = [str(root / s.path) for s in ds.index.shards]

    def transform(sample: tuple) -> tuple:
        image, label = sample
        return pillow_transform(image, specs, np.random.default_rng()), label

    def make() -> Iterable:
        pipeline = (
            wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, empty_check=False)
            .shuffle(1000).decode("pil").to_tuple("jpg", "cls").map(transform).batched(batch_size)
        )
        return wds.WebLoader(pipeline, batch_size=None, num_workers=workers)

    return make


def _dali_loader(ds: ShardedDataset, specs: tuple, batch_size: int, workers: int, gpu: bool) -> Callable[[], Iterable]:
    """DALI's own reader and decoder over the same tars, as its documentation recommends:
    fn.readers.webdataset with our .idx files, decoders.image_random_crop (ROI decoding) or
    decoders.image + resize for val, flip and CHW layout in crop_mirror_normalize."""
    import torch

    from fastload import transforms as T
    from fastload.backends.dali.library import import_dali, torch_iterator

    dali = import_dali()
    fn, types = dali.fn, dali.types
    root = _local_tars(ds, "DALI's webdataset reader")
    if gpu and not torch.cuda.is_available():
        raise RuntimeError("dali-gpu needs a CUDA GPU")
    paths = [str(root / s.path) for s in ds.index.shards]
    indexes = [str(root / offsets_name(s)) for s in ds.index.shards]
    size = T.output_size(specs) or (224, 224)
    train = any(isinstance(s, T.RandomResizedCrop) for s in specs)

    @dali.pipeline_def(batch_size=batch_size, num_threads=max(1, workers), device_id=0 if gpu else None)
    def pipeline():
        jpegs, labels = fn.readers.webdataset(
            paths=paths, index_paths=indexes, ext=["jpg", "cls"], random_shuffle=True, initial_fill=1024, name="reader"
        )
        device = "mixed" if gpu else "cpu"
        if train:
            images = fn.decoders.image_random_crop(jpegs, device=device, output_type=types.RGB)
            images = fn.resize(images, resize_x=size[1], resize_y=size[0])
            mirror = fn.random.coin_flip(probability=0.5)
        else:
            images = fn.decoders.image(jpegs, device=device, output_type=types.RGB)
            images = fn.resize(images, resize_shorter=int(size[0] / 0.875))
            mirror = 0
        images = fn.crop_mirror_normalize(images, crop=size, mirror=mirror, dtype=types.UINT8, output_layout="CHW")
        return images, fn.pad(labels, axes=(0,), shape=(LABEL_DIGITS,))  # ASCII digits, NUL-padded

    def make() -> Iterable:
        pipe = pipeline()
        pipe.build()
        return _DaliEpochs(torch_iterator(pipe, ["images", "labels"], "reader"))

    return make


class _DaliEpochs:
    """A DALI iterator as (images, labels) batches, one epoch per ``iter()``."""

    def __init__(self, iterator: Any) -> None:
        self.iterator = iterator

    def __iter__(self):
        return ((b[0]["images"], ascii_labels(b[0]["labels"])) for b in self.iterator)


def ascii_labels(digits: Any) -> Any:
    """Decimal labels from NUL-padded ASCII digit rows (how webdataset stores ``cls``)."""
    import torch

    values = torch.zeros(len(digits), dtype=torch.int64)
    for column in digits.cpu().to(torch.int64).T:
        present = column > 0
        values = torch.where(present, values * 10 + (column - 48), values)
    return values
