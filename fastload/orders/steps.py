"""Where a global step of an epoch ran. An epoch resumed (elastically) at other topologies ran in
segments: each of its ``resumed_from`` entries (world size, batch size, units consumed when it was
left, ...) one, then the current topology to the epoch's end; a global step is ``world_size *
batch_size`` units (samples, token rows) of its segment. :func:`step_at` is the one arithmetic
that finds a step's segment, for every kind of batch's ``describe``, and (:func:`current_segment`) the global step a
resumed loader numbers its batches from (``batch_map``'s generator)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from fastload.orders.position import ResumedFrom


@dataclass(frozen=True)
class StepAt:
    """Global step ``first_step + index`` of an epoch: its segment, that segment's topology and
    the units consumed before it."""

    segment: int  # which topology: resumed_from[segment], or len(resumed_from) for the current one
    world_size: int
    batch_size: int
    rank_existed: bool  # whether the rank asked about was one of the segment's ranks
    first_step: int  # the epoch's global step the segment began with
    start: int  # units consumed when the segment began, counted in its order (0 where each segment's order starts anew)
    index: int  # the step's index within the segment

    @property
    def consumed(self) -> int:
        """Units consumed before the step, counted as :attr:`start` is."""
        return self.start + self.index * self.world_size * self.batch_size


def _segments(resumed_from: Sequence[ResumedFrom], world_size: int, batch_size: int, rank: int,
              held: Callable[[int, int], int] | None, restarts: bool) -> Iterator[tuple[StepAt, int | None]]:
    """Each segment at its first step, with the steps it ran: a left segment ceil((units consumed when left - its start)
    / its step's units), at most ``held(segment, start)``; the current one None (its held steps not asked)."""
    first_step, start = 0, 0
    for segment, (world, batch, end, *_) in enumerate(resumed_from):
        start = 0 if restarts else start
        ran = -(-(end - start) // (world * batch))  # its steps up to the units consumed when it was left
        if held is not None:
            ran = min(ran, held(segment, start))
        yield StepAt(segment, world, batch, rank < world, first_step, start, 0), ran
        first_step, start = first_step + ran, end
    yield StepAt(len(resumed_from), world_size, batch_size, rank < world_size, first_step, 0 if restarts else start, 0), None


def step_at(epoch: int, step: int, resumed_from: Sequence[ResumedFrom], world_size: int, batch_size: int, rank: int,
            held: Callable[[int, int], int] | None = None, restarts: bool = False) -> StepAt:
    """Where global ``step`` of ``epoch`` ran for ``rank``, the epoch resumed from ``resumed_from`` and now at
    (``world_size``, ``batch_size``). A left segment ran ceil((units consumed when left - its start) / its step's units)
    steps, at most ``held(segment, start)`` (the steps its order holds from ``start``; the current segment runs
    them all, and on for ever without ``held``); ``restarts``: each segment's order counts its units from 0 (the
    streaming order's re-deal), else they run on. An IndexError names a step past the epoch's end."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    steps = 0  # the epoch's, once every segment's are counted
    for first, ran in _segments(resumed_from, world_size, batch_size, rank, held, restarts):
        if ran is None and held is not None:  # the current segment
            ran = held(first.segment, first.start)
        if ran is None or step < first.first_step + ran:
            return replace(first, index=step - first.first_step)
        steps = first.first_step + ran
    raise IndexError(f"step {step} is past the end of epoch {epoch} ({steps} steps)")


def current_segment(resumed_from: Sequence[ResumedFrom], world_size: int, batch_size: int, rank: int,
                    held: Callable[[int, int], int] | None = None, restarts: bool = False) -> StepAt:
    """The current topology's segment at its first step (index 0), counted as :func:`step_at` counts: the global
    step a loader resumed from ``resumed_from`` numbers its first batch after the units ``start`` with."""
    *_, (current, _) = _segments(resumed_from, world_size, batch_size, rank, held, restarts)
    return current
