"""fastload.orders.steps.step_at, the one arithmetic finding a global step's segment of an epoch resumed
at other topologies, against a run simulated step by step (every rank's loader of every kind of batch
asks it: describe of samples and of token rows)."""

from __future__ import annotations

import pytest

from fastload.orders.steps import step_at


def simulate(runs: list[tuple[int, int, int]], order_length: int, restarts: bool = False) -> tuple[list[tuple[int, ...]], list[tuple[int, int, int, int]]]:
    """A run of one epoch of ``order_length`` units over ``runs`` of (world size, batch size, steps taken there; the
    last: -1, to the end), each global step taking world * batch units (the epoch's last step what is left); ``restarts``:
    each topology deals the unseen units anew, counted from 0. Returns (its resumed_from, every step's
    (segment, world size, batch size, units consumed before it))."""
    resumed_from: list[tuple[int, ...]] = []
    steps: list[tuple[int, int, int, int]] = []
    consumed, left = 0, order_length
    for segment, (world, batch, taken) in enumerate(runs):
        taken = taken if taken >= 0 else -(-left // (world * batch))
        for _ in range(taken):
            steps.append((segment, world, batch, consumed))
            took = min(world * batch, left)
            consumed, left = consumed + took, left - took
        if segment < len(runs) - 1:
            resumed_from.append((world, batch, consumed))
            consumed = 0 if restarts else consumed
    return resumed_from, steps


def held_by(order_length: int, runs: list[tuple[int, int, int]], resumed_from: list[tuple[int, ...]], restarts: bool):
    """The steps each segment's order holds from ``start``: its units left (a re-dealt order: those not consumed before it), by ``world * batch``."""
    def held(segment: int, start: int) -> int:
        world, batch, _ = runs[segment]
        length = order_length - sum(entry[2] for entry in resumed_from[:segment]) if restarts else order_length
        return -(-(length - start) // (world * batch))
    return held


ELASTIC = [(4, 2, 3), (3, 2, 2), (2, 2, -1)]  # 4 ranks for 3 steps, then 3 ranks for 2, then 2 ranks to the end


@pytest.mark.parametrize("restarts", [False, True])
@pytest.mark.parametrize("order_length", [58, 61])  # the last step full, or partial
def test_every_step_of_an_elastic_resume_4_3_2_ranks_is_found_where_it_ran(order_length: int, restarts: bool) -> None:
    resumed_from, steps = simulate(ELASTIC, order_length, restarts)
    held = held_by(order_length, ELASTIC, resumed_from, restarts)
    for step, (segment, world, batch, consumed) in enumerate(steps):
        found = step_at(0, step, resumed_from, 2, 2, 0, held, restarts)
        assert (found.segment, found.world_size, found.batch_size, found.consumed) == (segment, world, batch, consumed)
        assert found.first_step + found.index == step and steps[found.first_step][0] == segment
        assert found.first_step == 0 or steps[found.first_step - 1][0] == segment - 1
    assert len({found.segment for found in (step_at(0, s, resumed_from, 2, 2, 0, held, restarts) for s in range(len(steps)))}) == 3
    with pytest.raises(IndexError, match=f"step {len(steps)} is past the end of epoch 7 .{len(steps)} steps."):
        step_at(7, len(steps), resumed_from, 2, 2, 0, held, restarts)


def test_a_rank_is_found_only_in_the_segments_that_had_it() -> None:
    resumed_from, steps = simulate(ELASTIC, 58)
    for step, (_, world, _, _) in enumerate(steps):
        assert [step_at(0, step, resumed_from, 2, 2, rank).rank_existed for rank in range(4)] == [rank < world for rank in range(4)]


def test_without_held_the_current_segment_runs_on_and_a_left_one_counts_its_partial_step() -> None:
    resumed_from = [(4, 2, 20), (3, 2, 32)]  # 20 units: 2 full steps of 8 and a partial one; then 12: 2 steps of 6
    found = [step_at(0, step, resumed_from, 2, 5, 1) for step in range(8)]
    assert [f.segment for f in found] == [0, 0, 0, 1, 1, 2, 2, 2]
    assert [f.consumed for f in found] == [0, 8, 16, 20, 26, 32, 42, 52]
    assert step_at(0, 10_000, resumed_from, 2, 5, 1).consumed == 32 + (10_000 - 5) * 10


def test_a_left_segment_runs_no_more_steps_than_its_order_held() -> None:
    # consumed 30 at 4 x 2 names 4 steps, but its order held 2 from 0 (e.g. a world size's cut of the order)
    found = step_at(0, 2, [(4, 2, 30)], 2, 2, 0, lambda segment, start: 2 if segment == 0 else 100)
    assert (found.segment, found.first_step, found.start, found.index) == (1, 2, 30, 0)


def test_entries_may_carry_more_than_their_topology_and_a_step_must_be_whole() -> None:
    plain, tokens = [(4, 2, 24)], [(4, 2, 24, 128, 3, 17)]  # the token rows' seq_len and best-fit's window beside it
    assert all(step_at(0, s, plain, 2, 2, 0) == step_at(0, s, tokens, 2, 2, 0) for s in range(6))
    with pytest.raises(ValueError, match="step must be >= 0"):
        step_at(0, -1, plain, 2, 2, 0)
