"""fastload.WeightSchedule with fastload.mix(by="samples"): weights that change over the run, read
by real loaders — the shares delivered over every window, describe's weights, exact and elastic
resume across the change, the schedule in the dataset's identity, refusals."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import fastload
from tests.storage.test_mix import CROP, members, rank_keys  # noqa: F401 - a fixture

STAGES = [(0, [0.9, 0.1]), (3_000, [0.2, 0.8]), (6_000, [0.5, 0.5])]


def scheduled(members: dict[str, Path], interpolate: str = "linear", stages: list = STAGES) -> fastload.MixedDataset:  # noqa: F811
    return fastload.mix([members["big"], members["small"]], samples_per_epoch=2_000,
                        weights=fastload.WeightSchedule(stages, interpolate=interpolate))


@pytest.mark.parametrize("interpolate", ["linear", "constant"])
def test_the_shares_delivered_are_within_half_a_point_of_the_schedule_over_every_window(members: dict[str, Path],  # noqa: F811
                                                                                         interpolate: str) -> None:
    """Five epochs of 2,000 samples (10,000 positions, through both changes): over every window of
    5,000 samples, sliding by one, the small member's share is within 0.5 points of the schedule's
    mean weight there; after any number of samples it is within 40 samples (a part's shuffle) of the
    schedule's running total; describe(step) gives the weights in force at the step's first sample."""
    schedule = fastload.WeightSchedule(STAGES, interpolate=interpolate)
    mixture = scheduled(members, interpolate)
    loader = fastload.DataLoader(mixture, batch_size=100, shuffle=True, seed=7, return_keys=True, transform=CROP)
    small = []
    for epoch in range(5):
        for step, batch in enumerate(loader):
            small += [mixture.member_key(k)[0] == 1 for k in batch[2]]
            assert loader.describe(step, epoch).weights == pytest.approx(schedule.weights_at(epoch * 2_000 + step * 100))
    small_share = np.asarray(small, dtype=np.float64)
    wanted = np.asarray([schedule.weights_at(p + 0.5)[1] for p in range(len(small))])
    window = 5_000
    delivered = np.convolve(small_share, np.ones(window), "valid") / window
    assert len(delivered) == 5_001 and np.abs(delivered - np.convolve(wanted, np.ones(window), "valid") / window).max() <= 0.005
    assert np.abs(np.cumsum(small_share) - np.cumsum(wanted)).max() <= 40
    if interpolate == "constant":  # a stage's weights hold until the next: 10% of the first 3,000, 80% of the next 3,000
        assert abs(sum(small[:3_000]) - 300) <= 40 and abs(sum(small[3_000:6_000]) - 2_400) <= 40


def test_each_member_epoch_holds_each_of_its_samples_once_under_a_schedule(members: dict[str, Path]) -> None:  # noqa: F811
    mixture = scheduled(members)
    loader = fastload.DataLoader(mixture, batch_size=50, shuffle=True, seed=2, return_keys=True, transform=CROP)
    keys = [k for _ in range(3) for batch in loader for k in batch[2]]
    for number in range(2):
        own = [key for key in keys if mixture.member_key(key)[0] == number]
        size = len(mixture.members[number])
        for start in range(0, len(own) - size + 1, size):  # each whole member epoch: every sample once
            assert Counter(own[start : start + size]) == Counter(f"{number}/{k}" for k in mixture.members[number].sample_keys())


@pytest.mark.parametrize("world_after", [1, 3])
def test_resume_at_another_world_size_across_the_change_delivers_every_remaining_sample_once(members: dict[str, Path],  # noqa: F811
                                                                                            world_after: int) -> None:
    """Epoch 1 (positions 2,000-4,000, across the change at 3,000): two ranks save after 5 steps,
    resumed at 1 or 3 ranks the samples before and after are the uninterrupted epoch's, and the
    state's member positions and weights are those the schedule gives there (the 1,950 samples left
    fill whole global steps of 10 and of 15: no padding)."""
    mixture = scheduled(members)
    kwargs = dict(batch_size=5, shuffle=True, seed=11)

    def from_epoch_1(world: int, state: dict | None, stop_after: int | None) -> tuple[list[str], list[dict]]:
        return rank_keys(mixture, world, state or {**start, "members": None}, stop_after, **kwargs)

    start = fastload.DataLoader(mixture, batch_size=5, shuffle=True, seed=11, transform=CROP)
    start.set_epoch(1)
    start = start.state_dict()
    whole, _ = from_epoch_1(1, None, None)
    before, states = from_epoch_1(2, None, 5)
    assert all(state == states[0] for state in states) and states[0]["samples_consumed"] == 50
    epoch_0 = Counter(mixture.member_key(k)[0] for k in rank_keys(mixture, 1, None, None, **kwargs)[0])
    member_counts = epoch_0 + Counter(mixture.member_key(k)[0] for k in before)
    for number, recorded in enumerate(states[0]["members"]):
        assert recorded["epoch"] * len(mixture.members[number]) + recorded["samples_consumed"] == member_counts[number]
        assert recorded["weight"] == pytest.approx(mixture.schedule.weights_at(2_050)[number])  # in force, not the first stage's
    after, finished = from_epoch_1(world_after, states[0], None)
    assert Counter(before) + Counter(after) == Counter(whole) and len(whole) == 2_000
    assert finished[0]["epoch"] == 2 and finished[0]["samples_consumed"] == 0


def test_the_schedule_is_part_of_the_datasets_identity(members: dict[str, Path]) -> None:  # noqa: F811
    """A state saved under one schedule is refused by a loader of another (its positions would name
    other samples); one of the same schedule given again loads it."""
    state = fastload.DataLoader(scheduled(members), batch_size=2, transform=CROP).state_dict()
    fastload.DataLoader(scheduled(members), batch_size=2, transform=CROP).load_state_dict(state)
    for other in (scheduled(members, "constant"), scheduled(members, stages=[(0, [0.9, 0.1]), (3_000, [0.2, 0.8])]),
                  fastload.mix({members["big"]: 0.9, members["small"]: 0.1}, samples_per_epoch=2_000)):
        with pytest.raises(ValueError, match="another dataset"):
            fastload.DataLoader(other, batch_size=2, transform=CROP).load_state_dict(state)


def test_a_schedule_keyed_by_member_and_one_in_member_order_mix_alike(members: dict[str, Path]) -> None:  # noqa: F811
    keyed = fastload.WeightSchedule([(at, {members["small"]: w[1], members["big"]: w[0]}) for at, w in STAGES])
    mixture = fastload.mix([members["big"], members["small"]], samples_per_epoch=2_000, weights=keyed)
    assert mixture.schedule == fastload.WeightSchedule(STAGES)
    assert fastload.WeightSchedule(**mixture.schedule.as_dict()) == mixture.schedule  # plain values, and back
    first = [b[2] for b in fastload.DataLoader(mixture, batch_size=50, shuffle=True, seed=1, return_keys=True, transform=CROP)]
    assert first == [b[2] for b in fastload.DataLoader(scheduled(members), batch_size=50, shuffle=True, seed=1, return_keys=True, transform=CROP,
                                                       num_workers=2)]


def test_a_member_weighed_0_in_a_stage_gives_no_samples_there(members: dict[str, Path]) -> None:  # noqa: F811
    mixture = scheduled(members, "constant", [(0, [1, 0]), (1_000, [0, 1])])
    loader = fastload.DataLoader(mixture, batch_size=100, return_keys=True, transform=CROP)
    owners = [mixture.member_key(k)[0] for batch in loader for k in batch[2]]
    assert Counter(owners) == {0: 1_000, 1: 1_000}  # each stage's own samples, exactly
    part = 1_000 // 64  # the weights change within one part of the run (1/64 of the shortest stage at most)
    assert owners[: 1_000 - part] == [0] * (1_000 - part) and owners[1_000 + part :] == [1] * (1_000 - part)


@pytest.mark.parametrize(("stages", "interpolate", "message"), [
    ([], "linear", "at least one stage"),
    ([(0, [1, 1]), (0, [1, 2])], "linear", "stage 1's at must be a whole number >= 0 above the previous"),
    ([(-1, [1, 1])], "linear", "stage 0's at must be"),
    ([(0, [1, 1]), (5, [1, 1, 1])], "linear", "stage 1's weights must be as many as stage 0's"),
    ([(0, [0, 0])], "linear", "not all 0"),
    ([(0, [1, float("nan")])], "linear", "each a number >= 0"),
    ([(0, {"a": 1}), (5, {"b": 1})], "linear", "stage 1 names other members than stage 0"),
    ([(0, [1, 1])], "cosine", "interpolate must be 'linear' or 'constant'"),
])
def test_a_malformed_schedule_is_refused_naming_the_stage(stages: list, interpolate: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fastload.WeightSchedule(stages, interpolate=interpolate)


def test_mix_refuses_a_schedule_that_does_not_fit_its_members(members: dict[str, Path]) -> None:  # noqa: F811
    two = [members["big"], members["small"]]
    with pytest.raises(ValueError, match="the schedule weighs 3 members, 2 were given"):
        fastload.mix(two, weights=fastload.WeightSchedule([(0, [1, 1, 1])]))
    with pytest.raises(ValueError, match="stages name other members than those given"):
        fastload.mix(two, weights=fastload.WeightSchedule([(0, {members["big"]: 1, "elsewhere": 1})]))
    with pytest.raises(ValueError, match="give either .* or a list of datasets and weights="):
        fastload.mix({members["big"]: 1, members["small"]: 1}, weights=fastload.WeightSchedule([(0, [1, 1])]))
    with pytest.raises(ValueError, match="give either"):
        fastload.mix(two)
    with pytest.raises(ValueError, match="a dataset is listed twice"):
        fastload.mix([members["big"], members["big"]], weights=fastload.WeightSchedule([(0, [1, 1])]))
    assert list(itertools.islice(fastload.DataLoader(fastload.mix(two, weights=fastload.WeightSchedule([(0, [1, 1])])), batch_size=2,
                                                     transform=CROP), 1))
