"""The orders through ``fastload.DataLoader`` with real worker processes: ``exclude=`` keys never
delivered and every other sample once, the same order whatever the worker count, class-balanced
epochs, exact resume at another world size, and states of the old order refused."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload.converters import ConvertOptions, convert
from tests.conftest import png_bytes, small_photo
from tests.hostile_data import run_limited, write_raw_dataset

COUNTS = [300, 120, 60, 20]  # samples of each class: unbalanced
BATCH = 5


@pytest.fixture(scope="module")
def unbalanced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("unbalanced")
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.repeat(np.arange(len(COUNTS)), COUNTS))
    np.savez(root / "raw.npz", images=rng.integers(0, 256, (len(labels), 8, 8, 3), dtype=np.uint8), labels=labels)
    convert(str(root / "raw.npz"), str(root / "wds"), ConvertOptions(source="npz", samples_per_shard=64))
    return root / "wds"


def loader(data: Path, **kwargs: object) -> fastload.DataLoader:
    values: dict = dict(batch_size=BATCH, shuffle=True, seed=3, return_keys=True, transform=[fastload.transforms.CenterCrop(8)])
    return fastload.DataLoader(data, **{**values, **kwargs})


def keys_and_labels(batches: object) -> tuple[list[str], list[int]]:
    keys, labels = [], []
    for _, batch_labels, batch_keys in batches:  # type: ignore[attr-defined]
        keys += batch_keys
        labels += batch_labels.tolist()
    return keys, labels


def all_keys(data: Path) -> list[str]:
    dataset = fastload.open(data)
    return [dataset.where(i).split(":")[1] for i in range(len(dataset))]


def test_excluded_keys_are_never_delivered_and_every_other_sample_is_once(unbalanced: Path, tmp_path: Path) -> None:
    keys = all_keys(unbalanced)
    excluded = keys[:3] + keys[250:262] + keys[-1:]
    listing = tmp_path / "exclude.txt"
    listing.write_text("".join(f"{key}\n" for key in excluded), encoding="utf-8")
    with loader(unbalanced, exclude=excluded, num_workers=2) as from_list, loader(unbalanced, exclude=listing) as from_file:
        for epoch in range(2):
            from_list.set_epoch(epoch)
            from_file.set_epoch(epoch)
            got, _ = keys_and_labels(from_list)
            assert Counter(got) == Counter(set(keys) - set(excluded))
            assert keys_and_labels(from_file)[0] == got  # a file of keys is the same list
        assert len(from_list) == -(-(len(keys) - len(excluded)) // BATCH)


def test_an_unknown_key_to_exclude_is_named(unbalanced: Path, tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="no-such-key"):
        loader(unbalanced, exclude=[all_keys(unbalanced)[0], "no-such-key"])
    with pytest.raises(ValueError, match="cannot read"):
        loader(unbalanced, exclude=tmp_path / "missing.txt")


@pytest.mark.parametrize("kwargs", [{}, {"exclude": ["00000007", "00000100"]}, {"balanced": True}])
def test_the_order_is_the_same_whatever_the_number_of_workers(unbalanced: Path, kwargs: dict) -> None:
    orders = []
    for workers in (0, 1, 2):
        with loader(unbalanced, num_workers=workers, **kwargs) as it:
            it.set_epoch(1)
            orders.append(keys_and_labels(it)[0])
    assert orders[0] == orders[1] == orders[2]


def test_balanced_epochs_draw_every_class_equally(unbalanced: Path) -> None:
    with loader(unbalanced, balanced=True, num_workers=2) as it:
        for epoch in range(2):
            it.set_epoch(epoch)
            keys, labels = keys_and_labels(it)
            assert len(keys) == sum(COUNTS)  # the dataset's epoch length
            assert Counter(labels) == {c: 125 for c in range(len(COUNTS))}
            uses = Counter(keys)  # the smallest class (20 samples) is reused, each sample 6 or 7 times
            smallest = [uses[k] for k, label in set(zip(keys, labels)) if label == 3]
            assert len(smallest) == 20 and min(smallest) == 6 and max(smallest) == 7
            # classes mix within batches: labels of consecutive batches are not sorted runs
            runs = sum(1 for _ in itertools.groupby(labels))
            assert runs > len(labels) / 2


def test_class_weights_by_label_give_each_class_its_share(unbalanced: Path) -> None:
    with loader(unbalanced, class_weights={0: 0, 3: 3}) as it:
        _, labels = keys_and_labels(it)
    assert Counter(labels) == {1: 100, 2: 100, 3: 300}  # weights 0, 1, 1, 3 of 500 positions


@pytest.mark.parametrize(("kwargs", "taken"), [({"exclude": ["00000001", "00000002", "00000300", "00000301", "00000499"]}, 3),
                                               ({"balanced": True}, 2)])
def test_a_resume_at_another_world_size_delivers_exactly_the_rest(unbalanced: Path, kwargs: dict, taken: int) -> None:
    """Two ranks take ``taken`` batches each and save; three ranks resume: what they deliver and
    what was seen make up the uninterrupted epoch, sample for sample (495 and 500 samples: the
    rest fills whole steps of 15, so no padding)."""
    with loader(unbalanced, **kwargs) as whole:
        whole.set_epoch(2)
        everything, _ = keys_and_labels(whole)
    seen, state = [], None
    for rank in range(2):
        with loader(unbalanced, rank=rank, world_size=2, num_workers=2, **kwargs) as it:
            it.set_epoch(2)
            seen += keys_and_labels(itertools.islice(iter(it), taken))[0]
            state = it.state_dict()
    rest = []
    for rank in range(3):
        with loader(unbalanced, rank=rank, world_size=3, **kwargs) as it:
            it.load_state_dict(state)
            rest += keys_and_labels(it)[0]
    assert Counter(seen + rest) == Counter(everything)
    assert Counter(seen) == Counter(everything[: 2 * BATCH * taken])  # the order's first global steps


@pytest.mark.parametrize("streaming", [False, True])
def test_a_resumed_epoch_resumed_again_at_a_third_world_size_delivers_exactly_the_rest(unbalanced: Path, streaming: bool) -> None:
    """Two ranks take a batch each and save; three ranks resume, take a batch each and save (their
    state carries the first topology in resumed_from); one rank resumes that: the three runs make up
    the uninterrupted epoch, sample for sample."""
    kwargs: dict = {"shuffle_buffer": 40} if streaming else {}
    with loader(unbalanced, **kwargs) as whole:
        whole.set_epoch(1)
        everything, _ = keys_and_labels(whole)
    seen, state = [], None
    for world in (2, 3):
        for rank in range(world):
            with loader(unbalanced, rank=rank, world_size=world, **kwargs) as it:
                if state is None:
                    it.set_epoch(1)
                else:
                    it.load_state_dict(state)
                seen += keys_and_labels(itertools.islice(iter(it), 1))[0]
                next_state = it.state_dict()
        state = next_state
    assert [list(step) for step in state["resumed_from"]] == [[2, BATCH, 2 * BATCH]]
    with loader(unbalanced, **kwargs) as it:
        it.load_state_dict(state)
        rest = keys_and_labels(it)[0]
    assert Counter(seen + rest) == Counter(everything)


@pytest.mark.parametrize("version", [1, 2])
def test_a_state_of_an_old_order_is_refused(unbalanced: Path, version: int) -> None:
    with loader(unbalanced) as it:
        state = {**it.state_dict(), "version": version}
        with pytest.raises(ValueError, match=f"version {version}.*older fastload whose shuffled orders differ"):
            it.load_state_dict(state)


@pytest.mark.parametrize(("saved", "loaded", "named"), [
    (dict(shuffle=True), dict(shuffle=False), "shuffle=True"),
    (dict(shuffle_buffer=2), dict(shuffle_buffer=6), "shuffle_buffer=2"),
    (dict(shuffle_buffer=2), dict(), "order='streaming'"),
])
def test_a_state_of_another_shuffle_is_refused(unbalanced: Path, saved: dict, loaded: dict, named: str) -> None:
    """The same position names other samples under another shuffle or buffer: refused, not resumed."""
    with loader(unbalanced, **saved) as first:
        next(iter(first))
        state = first.state_dict()
    with loader(unbalanced, **loaded) as second, pytest.raises(ValueError, match=f"saved with {named}"):
        second.load_state_dict(state)


def test_class_balance_needs_a_shuffled_global_order(unbalanced: Path) -> None:
    with pytest.raises(ValueError, match="need shuffle=True"):
        loader(unbalanced, balanced=True, shuffle=False)
    with pytest.raises(ValueError, match="not both"):
        loader(unbalanced, balanced=True, class_weights={0: 1})
    with pytest.raises(ValueError, match="'zebra'"):
        loader(unbalanced, class_weights={"zebra": 1})


def test_dalis_feed_follows_the_same_balanced_order_without_the_excluded(unbalanced: Path) -> None:
    """DALI's worker processes compute the order from the OrderSpec and the class members they are
    handed: the same keys, in the same order, as the CPU path."""
    pytest.importorskip("nvidia.dali")
    kwargs: dict = dict(balanced=True, exclude=["00000004", "00000040"], num_workers=1)
    orders = []
    for backend in ("cpu", "dali"):
        with loader(unbalanced, backend=backend, **kwargs) as it:
            it.set_epoch(1)
            orders.append(keys_and_labels(it)[0])
    assert orders[0] == orders[1] and "00000004" not in orders[0]


def test_balanced_memory_follows_the_samples_not_the_largest_label(tmp_path: Path) -> None:
    """One label of 10**9 among 12 samples: the balanced order holds the 12 samples and 4 classes
    (it needed ~7.5 GiB, a count for every label value up to the largest), under a 3 GiB address space."""
    labels = [0, 1, 7, 10**9] * 3
    write_raw_dataset(tmp_path / "ds", [(f"s{i:02d}", "png", png_bytes(small_photo(i, size=(8, 8))), label) for i, label in enumerate(labels)])
    got = run_limited(f"""
        import json, fastload
        loader = fastload.DataLoader({str(tmp_path / "ds")!r}, batch_size=4, shuffle=True, balanced=True, transform=[fastload.transforms.CenterCrop(8)])
        print(json.dumps(sorted(label for _, batch in loader for label in batch.tolist())))
    """)
    assert got == sorted(labels)  # 4 classes, 3 samples each: each class its equal share
