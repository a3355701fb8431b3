"""collate_fn= with torch's meaning and batch_map= on whole batches, through the public API on real
shards and real worker processes: the samples collate_fn sees, its equivalence with the default
stacking, loader.collate_fn, and batch_map's determinism across runs, worker counts and a resume."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

import fastload
from fastload import transforms as T
from fastload.workers.rng import batch_generator
from tests.conftest import jpeg_bytes, run_cli, small_photo

wds = pytest.importorskip("webdataset")
from tests.test_fields import write_tars  # noqa: E402


@pytest.fixture(scope="module")
def captioned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """jpg + cls + txt + a fixed-shape npy, indexed in place."""
    samples = [{"__key__": f"c{i:04d}", "jpg": jpeg_bytes(small_photo(i, size=(40, 50 + i))), "cls": str(i % 3),
                "txt": f"caption {i}", "npy": np.full(4, i, np.float32)} for i in range(14)]
    root = write_tars(tmp_path_factory.mktemp("captioned"), samples)
    run_cli("index", str(root))
    return root


def load(path: Path, **kwargs) -> fastload.DataLoader:
    kwargs.setdefault("num_workers", 2)
    kwargs.setdefault("transform", T.train(24))
    kwargs.setdefault("seed", 1)
    return fastload.DataLoader(str(path), batch_size=4, backend="cpu", shuffle=True, **kwargs)


class Recorder:
    """A collate_fn that keeps the samples it was given and collates them as torch does."""

    def __init__(self) -> None:
        self.seen: list[list] = []

    def __call__(self, samples: list) -> object:
        self.seen.append(samples)
        return default_collate(samples)


def equal(a: object, b: object) -> bool:
    """Same tensors (dtype and values) and values, tuples and lists alike (default_collate makes lists)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("workers", [0, 2])
def test_default_collate_gives_the_default_batches_from_torch_like_samples(clean: Path, workers: int) -> None:
    recorder = Recorder()
    default = list(load(clean, num_workers=workers))
    collated = list(load(clean, num_workers=workers, collate_fn=recorder))
    assert len(default) == len(collated) == 8
    assert all(equal(a, b) for a, b in zip(default, collated, strict=True))
    image, label = recorder.seen[0][0]
    assert isinstance(image, torch.Tensor) and image.shape == (3, 24, 24) and image.dtype == torch.uint8
    assert type(label) is int  # as an ImageFolder returns it
    assert [len(s) for s in recorder.seen] == [4] * 7 + [2]


def test_samples_follow_fields_return_keys_and_evaluation(captioned: Path) -> None:
    kwargs = dict(fields=["jpg", "txt", "cls", "npy"], return_keys=True, evaluation=True)
    recorder = Recorder()
    default = list(load(captioned, **kwargs))
    collated = list(load(captioned, collate_fn=recorder, **kwargs))
    assert all(equal(a, b) for a, b in zip(default, collated, strict=True))
    image, text, label, array, key, valid = recorder.seen[0][0]
    assert image.shape == (3, 24, 24) and text.startswith("caption ") and type(label) is int
    assert array.shape == (4,) and array.dtype == torch.float32 and key.startswith("c0") and valid is True
    assert text == f"caption {int(key[1:])}" and float(array[0]) == int(key[1:])


def test_unlabelled_samples_are_dicts(clean: Path, tmp_path: Path) -> None:
    tars = write_tars(tmp_path / "plain", [{"__key__": f"u{i}", "jpg": jpeg_bytes(small_photo(i))} for i in range(6)])
    run_cli("index", str(tars))
    recorder = Recorder()
    default = list(load(tars, return_keys=True))
    collated = list(load(tars, return_keys=True, collate_fn=recorder))
    assert all(equal(a, b) for a, b in zip(default, collated, strict=True))
    assert set(recorder.seen[0][0]) == {"image", "key"}


def test_a_custom_collate_and_loader_collate_fn(clean: Path) -> None:
    def images_only(samples: list) -> torch.Tensor:
        return torch.stack([image for image, _ in samples]).float().div(255)

    dl = load(clean, collate_fn=images_only, num_workers=0)
    batch = next(iter(dl))
    assert batch.shape == (4, 3, 24, 24) and batch.dtype == torch.float32 and float(batch.max()) <= 1
    assert dl.collate_fn([(torch.ones(3, 2, 2, dtype=torch.uint8), 0)]).shape == (1, 3, 2, 2)  # what frameworks call
    # a torch DataLoader of the loader's parts (Accelerate's skip_first_batches) yields the same batches
    parts = torch.utils.data.DataLoader(dl.dataset, batch_sampler=dl.batch_sampler, collate_fn=dl.collate_fn)
    assert all(torch.equal(a, b) for a, b in zip(parts, load(clean, collate_fn=images_only, num_workers=0), strict=True))
    with pytest.raises(TypeError, match="collate_fn= must be a callable"):
        load(clean, collate_fn="stack")


def mixup(batch: tuple, generator: torch.Generator) -> tuple:
    """Mixup of each image with another one of the batch, by a weight drawn from the generator."""
    images, labels = batch
    weight = float(torch.rand((), generator=generator))
    partner = torch.randperm(len(images), generator=generator)
    mixed = images.float() * weight + images[partner].float() * (1 - weight)
    return mixed, labels, labels[partner], weight


def run(clean: Path, workers: int, state: dict | None = None, stop_after: int | None = None) -> tuple[list, dict]:
    dl = load(clean, num_workers=workers, batch_map=mixup)
    if state is not None:
        dl.load_state_dict(state)
    out = []
    for batch in dl:
        out.append(batch)
        if len(out) == stop_after:
            break
    return out, dl.state_dict()


def test_batch_map_is_deterministic_across_runs_workers_and_a_mid_epoch_resume(clean: Path) -> None:
    first, _ = run(clean, 2)
    assert len(first) == 8 and first[0][0].dtype == torch.float32
    again, _ = run(clean, 0)
    head, state = run(clean, 2, stop_after=3)
    tail, _ = run(clean, 1, state=state)
    for got in (again, head + tail):
        assert all(equal(a, b) for a, b in zip(got, first, strict=True))
    weights = [batch[3] for batch in first]
    assert len(set(weights)) == len(weights)  # a fresh draw per batch
    next_epoch, _ = run(clean, 2, state={**state, "epoch": 1, "samples_consumed": 0})
    assert [b[3] for b in next_epoch] != weights  # and per epoch
    plain = list(load(clean))
    assert all(torch.equal(b[1], a[1]) for a, b in zip(plain, first, strict=True))  # the same samples, mixed
    assert not torch.equal(first[0][0], plain[0][0].float())


def test_collate_fn_then_batch_map(clean: Path) -> None:
    def as_dict(samples: list) -> dict:
        images, labels = default_collate(samples)
        return {"x": images, "y": labels}

    def flip(batch: dict, generator: torch.Generator) -> dict:
        assert isinstance(generator, torch.Generator) and generator.device == torch.device("cpu")
        return {**batch, "x": batch["x"].flip(-1)}

    plain = list(load(clean))
    both = list(load(clean, collate_fn=as_dict, batch_map=flip))
    assert all(torch.equal(b["x"], a[0].flip(-1)) and torch.equal(b["y"], a[1]) for a, b in zip(plain, both, strict=True))
    with pytest.raises(ValueError, match="applies to fastload datasets"):
        fastload.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4)), batch_map=flip)


def noisy_caption(sample: dict, rng: np.random.Generator) -> dict:
    """A map= step that draws from its generator: the caption gets a number, the array noise."""
    sample["txt"] = f"{sample['txt']} #{int(rng.integers(1000))}"
    sample["npy"] = sample["npy"] + rng.standard_normal(4).astype(np.float32)
    return sample


def shuffled_rows(batch: tuple, generator: torch.Generator) -> tuple:
    """A batch_map= that permutes the images by its generator."""
    images, *rest = batch
    return (images[torch.randperm(len(images), generator=generator)], *rest)


@pytest.mark.parametrize("torch_workers", [0, 2])
def test_a_torch_loader_of_the_parts_yields_fields_map_and_batch_map_batches(captioned: Path, torch_workers: int) -> None:
    """Accelerate's skip_first_batches builds a torch DataLoader from loader.dataset, .batch_sampler and
    .collate_fn: with fields=, map= and batch_map= its batches equal the loader's, also after a resume."""
    kwargs = dict(fields=["jpg", "txt", "cls", "npy"], map=noisy_caption, batch_map=shuffled_rows, return_keys=True,
                  transform=T.train(24, normalize=True))

    def parts(dl: fastload.DataLoader) -> list:
        return list(torch.utils.data.DataLoader(dl.dataset, batch_sampler=dl.batch_sampler, collate_fn=dl.collate_fn,
                                                num_workers=torch_workers))

    expected = list(load(captioned, **kwargs))
    assert len(expected) == 4 and expected[0][0].dtype == torch.float32 and "#" in expected[0][1][0]
    assert all(equal(a, b) for a, b in zip(parts(load(captioned, **kwargs)), expected, strict=True))
    interrupted = load(captioned, **kwargs)
    it = iter(interrupted)
    next(it), next(it)
    state = interrupted.state_dict()
    resumed = load(captioned, **kwargs)
    resumed.load_state_dict(state)
    assert all(equal(a, b) for a, b in zip(parts(resumed), expected[2:], strict=True))
    assert not equal(parts(load(captioned, **{**kwargs, "seed": 5}))[0][0], expected[0][0])  # the check can fail


def one_draw(batch: tuple, generator: torch.Generator) -> tuple:
    """A batch_map= that keeps its batch and adds one draw of its generator."""
    return (*batch, int(torch.randint(0, 2**62, (), generator=generator)))


@pytest.mark.parametrize("streaming", [False, True])
def test_batch_map_numbers_the_steps_after_a_resume_at_another_world_size_as_describe_does(clean: Path, streaming: bool) -> None:
    """Four ranks take two batches of 2 each (16 samples: 2 global steps of 8) and save; two ranks resume (steps of 4):
    each resumed batch's batch_map draw is that of the generator seeded with the global step describe names its batch
    (2.., the left topology's steps at their size, then these), the batch sampler numbers the batches so, and no draw
    repeats one of the rank's earlier steps of the epoch (the streaming order re-deals, its positions from 0 again)."""
    kwargs: dict = dict(batch_size=2, num_workers=0, seed=3, shuffle=True, transform=T.train(16), return_keys=True,
                        batch_map=one_draw, backend="cpu")
    if streaming:
        kwargs["shuffle_buffer"] = 4
    earlier, state = {}, None
    for rank in range(4):
        with fastload.DataLoader(str(clean), rank=rank, world_size=4, **kwargs) as it:
            it.set_epoch(2)
            earlier[rank] = [batch[-1] for batch in itertools.islice(iter(it), 2)]
            state = it.state_dict()
    for rank in range(2):
        with fastload.DataLoader(str(clean), rank=rank, world_size=2, **kwargs) as it:
            it.load_state_dict(state)
            sampled = [batch.step for batch in it.batch_sampler]
            resumed = [(list(keys), draw) for *_, keys, draw in it]
            first = state["samples_consumed"] // (4 * 2)  # the steps of the left topology
            steps = list(range(first, first + len(resumed)))
            assert [it.describe(step).keys for step in steps] == [keys for keys, _ in resumed]
        expected = [int(torch.randint(0, 2**62, (), generator=batch_generator(3, 2, step, rank, None))) for step in steps]
        assert [draw for _, draw in resumed] == expected
        assert not {draw for _, draw in resumed} & set(earlier[rank])
        assert sampled == steps
