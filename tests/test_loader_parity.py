"""Given any torch Dataset, fastload.DataLoader behaves exactly like torch's: a parity suite runs
the same scenarios through both and compares every batch."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import fastload


class Squares(Dataset):
    """Map-style: tuples of (tensor, int, dict) so collate recurses through every container."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.tensor([i, i * i], dtype=torch.float32), i % 3, {"id": i, "name": f"s{i}"}


class Counting(IterableDataset):
    """Iterable-style, split between workers with get_worker_info() the documented way."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        for i in range(worker, self.n, workers):
            yield {"x": torch.tensor(i), "worker": worker}


def tag_worker(worker_id: int) -> None:
    torch.manual_seed(1234 + worker_id)


def collate_sum(batch):
    return sum(item[1] for item in batch), len(batch)


def as_comparable(batch):
    """Tensors to lists, recursively, for == comparison."""
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    if isinstance(batch, dict):
        return {k: as_comparable(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [as_comparable(v) for v in batch]
    return batch


SCENARIOS = {
    "defaults": dict(),
    "batch7_drop_last": dict(batch_size=7, drop_last=True),
    "batch7_keep_last": dict(batch_size=7),
    "shuffle_seeded": dict(batch_size=5, shuffle=True),
    "workers2": dict(batch_size=4, num_workers=2),
    "workers2_shuffle_prefetch": dict(batch_size=3, shuffle=True, num_workers=2, prefetch_factor=3, persistent_workers=True),
    "custom_collate": dict(batch_size=6, collate_fn=collate_sum),
    "no_batching": dict(batch_size=None),
    "worker_init_fn": dict(batch_size=4, num_workers=2, worker_init_fn=tag_worker),
    "sampler": dict(batch_size=4, sampler=list(range(20, 0, -2))),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_map_style_parity(name: str) -> None:
    kwargs = SCENARIOS[name]
    dataset = Squares(23)

    def run(cls):
        generator = torch.Generator().manual_seed(7)
        loader = cls(dataset, generator=generator, **kwargs)
        return len(loader), [as_comparable(b) for b in loader], [as_comparable(b) for b in loader]

    assert run(fastload.DataLoader) == run(torch.utils.data.DataLoader)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_parity_with_worker_info(num_workers: int) -> None:
    def run(cls):
        return [as_comparable(b) for b in cls(Counting(17), batch_size=4, num_workers=num_workers)]

    ours = run(fastload.DataLoader)
    assert ours == run(torch.utils.data.DataLoader)
    assert sorted(x for b in ours for x in b["x"]) == list(range(17))


def test_fastload_only_arguments_are_refused_for_torch_datasets() -> None:
    with pytest.raises(ValueError, match="transform= applies to fastload datasets"):
        fastload.DataLoader(Squares(3), transform=fastload.transforms.val(8))
