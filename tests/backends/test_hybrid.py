"""backend="hybrid": each batch split between DALI (its first samples) and the CPU workers (the rest),
in the CPU path's order, with its crop plans and its resume. DALI runs on its CPU here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fastload
from fastload import transforms as T
from fastload.errors import SampleError
from tests.conftest import demo_dataset

pytest.importorskip("nvidia.dali")

ARGS = dict(batch_size=20, shuffle=True, seed=11, num_workers=2, transform=T.train(48), return_keys=True)


@pytest.fixture(scope="module")
def wds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """90 demo images (ImageNet-like sizes) in 4 shards: 5 batches of 20, the last one partial."""
    return demo_dataset(tmp_path_factory.mktemp("hybrid"), 90, samples_per_shard=25)


def batches(path: Path, backend: str, epochs: int = 1, **kwargs) -> list[tuple[torch.Tensor, torch.Tensor, list[str]]]:
    with fastload.DataLoader(path, backend=backend, **{**ARGS, **kwargs}) as loader:
        return [(x.clone(), y.clone(), keys) for _ in range(epochs) for x, y, keys in loader]


def test_hybrid_gives_the_cpu_paths_samples_in_order_over_epochs(wds: Path) -> None:
    cpu, hybrid = batches(wds, "cpu", epochs=2), batches(wds, "hybrid", epochs=2)
    assert [keys for *_, keys in hybrid] == [keys for *_, keys in cpu] and len(cpu) == 10
    for (x_cpu, y_cpu, _), (x_hybrid, y_hybrid, _) in zip(cpu, hybrid, strict=True):
        assert x_hybrid.shape == x_cpu.shape and x_hybrid.dtype == torch.uint8 and torch.equal(y_cpu, y_hybrid)
        assert (x_cpu.float() - x_hybrid.float()).abs().mean() < 3  # same plans; the two decoders differ by about a level


def test_a_hybrid_batch_is_dalis_rows_then_the_cpu_workers_rows(wds: Path) -> None:
    """Each batch is a prefix decoded by DALI (row for row what backend='dali' gives) and the rest
    decoded by the CPU workers (what backend='cpu' gives), with DALI's part never empty."""
    cpu, dali, hybrid = batches(wds, "cpu"), batches(wds, "dali"), batches(wds, "hybrid")
    both_engines = 0
    for (x_cpu, *_), (x_dali, *_), (x_hybrid, *_) in zip(cpu, dali, hybrid, strict=True):
        from_dali = [torch.equal(row, expected) for row, expected in zip(x_hybrid, x_dali)]
        from_cpu = [torch.equal(row, expected) for row, expected in zip(x_hybrid, x_cpu)]
        splits = [k for k in range(1, len(x_hybrid) + 1) if all(from_dali[:k]) and all(from_cpu[k:])]
        assert splits, (from_dali, from_cpu)
        both_engines += min(splits) < len(x_hybrid)
    assert both_engines >= 3  # the CPU workers took part in most batches


def test_hybrid_resumes_where_it_stopped_with_the_cpu_paths_state(wds: Path) -> None:
    full = [keys for *_, keys in batches(wds, "cpu")]
    states = {}
    for backend in ("cpu", "hybrid"):
        with fastload.DataLoader(wds, backend=backend, **ARGS) as loader:
            for _ in zip(range(2), loader):
                pass
            states[backend] = loader.state_dict()
    assert states["hybrid"] == states["cpu"]
    with fastload.DataLoader(wds, backend="hybrid", **ARGS) as loader:
        loader.load_state_dict(states["hybrid"])
        assert [keys for *_, keys in loader] == full[2:]
        assert [keys for *_, keys in loader] == [keys for *_, keys in batches(wds, "cpu", epochs=2)][5:]  # the next epoch


def test_hybrid_needs_cpu_workers(wds: Path) -> None:
    with pytest.raises(ValueError, match="num_workers >= 1"):
        fastload.DataLoader(wds, backend="hybrid", batch_size=4, transform=T.val(32))


def test_hybrid_skips_or_names_corrupt_samples_like_the_cpu_path(corrupt: tuple[Path, set[str]]) -> None:
    """A bad header is skipped or raised in whichever engine's part it falls; JPEG data DALI cannot
    decode is redone on the CPU path, which names or replaces the sample."""
    path, bad = corrupt
    kwargs = dict(batch_size=4, transform=T.val(16), num_workers=2, shuffle=True, seed=2, return_keys=True)
    with fastload.DataLoader(path, backend="hybrid", **kwargs) as loader, pytest.raises(SampleError) as info:
        list(loader)
    assert info.value.where.split(":", 1)[1] in bad
    keys = {}
    for backend in ("cpu", "hybrid"):
        with fastload.DataLoader(path, backend=backend, on_error="skip", **kwargs) as loader:
            keys[backend] = [k for *_, ks in loader for k in ks]
            assert len(loader.stats.skipped) == 2
    assert keys["hybrid"] == keys["cpu"] and len(keys["cpu"]) == 30 and not bad & set(keys["cpu"])
